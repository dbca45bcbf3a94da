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
set title 'v100-pcie × 16 GPUs; 4 models; generator preset naive, seed 1' font ',5' noenhanced
set ylabel 'Speedup over fastmoe (x)'
set yrange [0:3.672]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "fastmoe" ci "shadowing" ci "smart" ci "fastermoe" ci
"gpt-s" 1.0000 0.0000 1.7587 0.1358 1.4378 0.0104 2.0953 0.1353
"gpt-l" 1.0000 0.0000 1.5202 0.1086 1.2230 0.0067 1.6419 0.1231
"bert-deep" 1.0000 0.0000 2.3459 0.2367 1.4554 0.0060 2.8839 0.2280
"bert-deep-l" 1.0000 0.0000 2.0418 0.1754 1.2313 0.0094 2.2341 0.1599
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key top left horizontal
set xtics rotate by 20 right
plot for [i=0:3] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
