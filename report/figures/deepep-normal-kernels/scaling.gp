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
8 1.3378 0
16 2.46535 0
32 3.70251 0
64 4.36105 0
EOD
$s1 << EOD
8 2.59358 0
16 4.77048 0
32 7.15479 0
64 8.40191 0
EOD
$s2 << EOD
8 0.883281 0
16 1.09327 0
32 1.65772 0
64 2.1493 0
EOD
$s3 << EOD
8 1.71209 0
16 2.11698 0
32 3.20888 0
64 4.15848 0
EOD
set logscale x 2
set yrange [0:*]
set ytics 2
set xlabel 'GPUs'
set ylabel 'All-to-all time (ms)'
set key below Left reverse font ',6'
set format y '%g'
plot $s0 using 1:2 with linespoints lt 1 title 'linear dispatch', $s1 using 1:2 with linespoints lt 2 title 'linear combine', $s2 using 1:2 with linespoints lt 3 title 'deepep dispatch', $s3 using 1:2 with linespoints lt 4 title 'deepep combine'
