# moesim plot: scaling (run `gnuplot scaling.gp` to render it again)
set terminal pngcairo noenhanced color font 'Helvetica,9' size 1050,720 fontscale 3.125 linewidth 4
set output (exists('outfile') ? outfile : 'scaling.png')
set border 3 lw 1
set tics nomirror out scale 0.5
set grid ytics lc rgb '#d9d9d9' lw 0.5 dt 1
set key noautotitle samplen 1.5 spacing 1.1 font ',8'
set style fill solid 0.85 border rgb '#333333'
set datafile separator whitespace
set datafile missing '?'
set linetype 1 lc rgb '#0072B2' lw 1 pt 5 ps 0.6
set linetype 2 lc rgb '#E69F00' lw 1 pt 7 ps 0.6
set linetype 3 lc rgb '#009E73' lw 1 pt 9 ps 0.6
set linetype 4 lc rgb '#D55E00' lw 1 pt 11 ps 0.6
set linetype 5 lc rgb '#56B4E9' lw 1 pt 5 ps 0.6
set linetype 6 lc rgb '#CC79A7' lw 1 pt 7 ps 0.6
set linetype 7 lc rgb '#F0E442' lw 1 pt 9 ps 0.6
set linetype 8 lc rgb '#000000' lw 1 pt 11 ps 0.6
set linetype cycle 8
$s0 << EOD
16 0.0817453 0
64 0.386129 0
256 1.54273 0
1024 6.15175 0
EOD
$s1 << EOD
16 0.758951 0
64 1.57124 0
256 2.85481 0
1024 7.49558 0
EOD
$s2 << EOD
16 5.65231 0
64 10.1346 0
256 12.3357 0
1024 17.2058 0
EOD
$s3 << EOD
16 0.0472782 0
64 0.0996622 0
256 0.248258 0
1024 0.825282 0
EOD
$s4 << EOD
16 0.927003 0
64 1.48729 0
256 1.76286 0
1024 2.37163 0
EOD
$s5 << EOD
16 7.28372 0
64 11.514 0
256 12.7071 0
1024 13.5452 0
EOD
set logscale x 2
set logscale y 10
set xlabel 'GPUs'
set ylabel 'All-to-all time (ms)'
set key below Left reverse font ',6'
set format y '%g'
plot $s0 using 1:2 with linespoints lt 1 title 'linear 1 MiB', $s1 using 1:2 with linespoints lt 2 title 'linear 32 MiB', $s2 using 1:2 with linespoints lt 3 title 'linear 256 MiB', $s3 using 1:2 with linespoints lt 4 title '2dh 1 MiB', $s4 using 1:2 with linespoints lt 5 title '2dh 32 MiB', $s5 using 1:2 with linespoints lt 6 title '2dh 256 MiB'
