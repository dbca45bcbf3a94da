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
set title 'rtx3090-pcie × 16 GPUs; 2 models; generator preset pro-prophet, seed 1' font ',5' noenhanced
set ylabel 'Speedup over planner (x)'
set yrange [0:1.180]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "planner" ci "top2" ci "top3" ci
"k1" 1.0000 0.0000 0.8098 0.0126 0.7190 0.0156
"k2" 1.0000 0.0000 0.9251 0.0099 0.8791 0.0218
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key top left horizontal
set xtics rotate by 20 right
plot for [i=0:2] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
