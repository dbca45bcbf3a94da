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
set title 'p4d-a100 × 32 GPUs; BERT-MoE-Deep (24 layers, 64 experts, top-2); generator preset naive, se...' font ',5' noenhanced
set ylabel 'Speedup over ep (x)'
set yrange [0:4.366]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$bars << EOD
"ep" 1.0000 0.0000
"fastermoe" 1.0755 0.0075
"smartmoe" 0.9896 0.0190
"flexmoe" 2.3367 0.1126
"hecate" 3.4980 0.2017
"hecate-rm" 3.4464 0.1978
EOD
set xtics rotate by 30 right
set boxwidth 0.7
set xrange [-0.6:*]
plot $bars using 0:2:(int($0) % 8 + 1):xtic(1) with boxes lc variable, '' using 0:2:3 with yerrorbars lc rgb '#333333' pt 7 ps 0 notitle, '' using 0:($2+$3):(sprintf('%.2f', $2)) with labels offset 0,0.5 font ',7'
