# moesim plot: speedup (run `gnuplot speedup.gp` to render it again)
set terminal pngcairo noenhanced color font 'Helvetica,9' size 1050,720 fontscale 3.125 linewidth 4
set output (exists('outfile') ? outfile : 'speedup.png')
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
set title 'p3dn-v100 × 16 GPUs; 4 models; generator preset naive, seed 1' font ',5' noenhanced
set ylabel 'Speedup over ep (x)'
set yrange [0:3.301]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "smartmoe" ci "flexmoe" ci "hecate" ci
"gpt-s" 1.0000 0.0000 1.0939 0.0116 0.9837 0.0374 1.3118 0.0445 2.6853 0.1125
"gpt-l" 1.0000 0.0000 1.2718 0.0186 0.9915 0.0355 1.4047 0.0520 2.4143 0.1400
"bert" 1.0000 0.0000 1.1737 0.0152 0.9851 0.0408 1.3906 0.0562 1.7996 0.1354
"bert-deep" 1.0000 0.0000 1.1768 0.0122 1.0072 0.0231 1.3927 0.0371 1.8137 0.1016
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key outside right top vertical Left reverse samplen 1 font ',7'
set xtics rotate by 20 right
plot for [i=0:4] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
