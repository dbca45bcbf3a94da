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
set title 'p3dn-v100 × 32 GPUs; 4 models; generator preset naive, seed 1' font ',5' noenhanced
set ylabel 'Speedup over ep (x)'
set yrange [0:3.937]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "smartmoe" ci "flexmoe" ci "hecate" ci
"gpt-s" 1.0000 0.0000 1.0870 0.0142 0.9151 0.0441 1.4647 0.0567 3.1156 0.2206
"gpt-l" 1.0000 0.0000 1.2568 0.0174 0.9279 0.0398 1.5754 0.0610 2.8379 0.1703
"bert" 1.0000 0.0000 1.1548 0.0160 0.9148 0.0451 1.5458 0.0636 2.0530 0.1141
"bert-deep" 1.0000 0.0000 1.1522 0.0075 0.9551 0.0208 1.5593 0.0443 2.0479 0.1014
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key outside right top vertical Left reverse samplen 1 font ',7'
set xtics rotate by 20 right
plot for [i=0:4] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
