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
32 0.351663 0
EOD
$s1 << EOD
32 0.362914 0
EOD
$s2 << EOD
32 0.722947 0
EOD
$s3 << EOD
32 3.32448 0
EOD
$s4 << EOD
32 24.1367 0
EOD
$s5 << EOD
32 74.6807 0
EOD
$s6 << EOD
32 238.206 0
EOD
$s7 << EOD
32 761.485 0
EOD
$s8 << EOD
32 0.101741 0
EOD
$s9 << EOD
32 0.115414 0
EOD
$s10 << EOD
32 0.552952 0
EOD
$s11 << EOD
32 3.71452 0
EOD
$s12 << EOD
32 29.007 0
EOD
$s13 << EOD
32 90.4317 0
EOD
$s14 << EOD
32 289.159 0
EOD
$s15 << EOD
32 925.085 0
EOD
$s16 << EOD
32 0.351663 0
EOD
$s17 << EOD
32 0.362914 0
EOD
$s18 << EOD
32 0.722947 0
EOD
$s19 << EOD
32 3.32448 0
EOD
$s20 << EOD
32 24.1367 0
EOD
$s21 << EOD
32 74.6807 0
EOD
$s22 << EOD
32 238.206 0
EOD
$s23 << EOD
32 761.485 0
EOD
$s24 << EOD
32 0.0412547 0
EOD
$s25 << EOD
32 0.0708513 0
EOD
$s26 << EOD
32 1.01794 0
EOD
$s27 << EOD
32 7.86144 0
EOD
$s28 << EOD
32 62.6094 0
EOD
$s29 << EOD
32 195.569 0
EOD
$s30 << EOD
32 625.731 0
EOD
$s31 << EOD
32 2002.25 0
EOD
set logscale x 2
set logscale y 10
set xlabel 'GPUs'
set ylabel 'All-to-all time (ms)'
set key below Left reverse font ',6'
set format y '%g'
plot $s0 using 1:2 with linespoints lt 1 title 'linear 1 KiB', $s1 using 1:2 with linespoints lt 2 title 'linear 32 KiB', $s2 using 1:2 with linespoints lt 3 title 'linear 1 MiB', $s3 using 1:2 with linespoints lt 4 title 'linear 8 MiB', $s4 using 1:2 with linespoints lt 5 title 'linear 64 MiB', $s5 using 1:2 with linespoints lt 6 title 'linear 200 MiB', $s6 using 1:2 with linespoints lt 7 title 'linear 640 MiB', $s7 using 1:2 with linespoints lt 8 title 'linear 2 GiB', $s8 using 1:2 with linespoints lt 1 title '2dh 1 KiB', $s9 using 1:2 with linespoints lt 2 title '2dh 32 KiB', $s10 using 1:2 with linespoints lt 3 title '2dh 1 MiB', $s11 using 1:2 with linespoints lt 4 title '2dh 8 MiB', $s12 using 1:2 with linespoints lt 5 title '2dh 64 MiB', $s13 using 1:2 with linespoints lt 6 title '2dh 200 MiB', $s14 using 1:2 with linespoints lt 7 title '2dh 640 MiB', $s15 using 1:2 with linespoints lt 8 title '2dh 2 GiB', $s16 using 1:2 with linespoints lt 1 title 'pipe 1 KiB', $s17 using 1:2 with linespoints lt 2 title 'pipe 32 KiB', $s18 using 1:2 with linespoints lt 3 title 'pipe 1 MiB', $s19 using 1:2 with linespoints lt 4 title 'pipe 8 MiB', $s20 using 1:2 with linespoints lt 5 title 'pipe 64 MiB', $s21 using 1:2 with linespoints lt 6 title 'pipe 200 MiB', $s22 using 1:2 with linespoints lt 7 title 'pipe 640 MiB', $s23 using 1:2 with linespoints lt 8 title 'pipe 2 GiB', $s24 using 1:2 with linespoints lt 1 title '1dh 1 KiB', $s25 using 1:2 with linespoints lt 2 title '1dh 32 KiB', $s26 using 1:2 with linespoints lt 3 title '1dh 1 MiB', $s27 using 1:2 with linespoints lt 4 title '1dh 8 MiB', $s28 using 1:2 with linespoints lt 5 title '1dh 64 MiB', $s29 using 1:2 with linespoints lt 6 title '1dh 200 MiB', $s30 using 1:2 with linespoints lt 7 title '1dh 640 MiB', $s31 using 1:2 with linespoints lt 8 title '1dh 2 GiB'
