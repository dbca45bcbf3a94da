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
8 1.3462 0
16 2.59199 0
32 3.93405 0
64 4.67116 0
EOD
$s1 << EOD
8 2.60198 0
16 4.98063 0
32 7.48456 0
64 8.93113 0
EOD
$s2 << EOD
8 0.891681 0
16 1.60237 0
32 1.7906 0
64 2.23982 0
EOD
$s3 << EOD
8 1.72049 0
16 2.6687 0
32 3.34771 0
64 4.33271 0
EOD
set logscale x 2
set logscale y 10
set xlabel 'GPUs'
set ylabel 'All-to-all time (ms)'
set key below Left reverse font ',6'
set format y '%g'
plot $s0 using 1:2 with linespoints lt 1 title 'linear dispatch', $s1 using 1:2 with linespoints lt 2 title 'linear combine', $s2 using 1:2 with linespoints lt 3 title 'deepep dispatch', $s3 using 1:2 with linespoints lt 4 title 'deepep combine'
