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
set title 'p3dn-v100 × 32 GPUs; GPT-MoE-S (12 layers, 64 experts, top-2); generator preset naive, seed 1' font ',5' noenhanced
set ylabel 'Speedup over ep (x)'
set yrange [0:7.005]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "smartmoe" ci "flexmoe" ci "hecate" ci "hecate-rm" ci
"b1" 1.0000 0.0000 1.0582 0.0128 0.9003 0.0438 1.6491 0.0717 2.1712 0.1473 2.1219 0.1428
"b2" 1.0000 0.0000 1.0696 0.0142 0.9126 0.0448 1.7751 0.0800 3.1576 0.2273 3.0533 0.2172
"b3" 1.0000 0.0000 1.0742 0.0145 0.9093 0.0525 1.8345 0.0911 3.9192 0.3089 3.7597 0.2917
"b4" 1.0000 0.0000 1.0773 0.0146 0.9027 0.0438 1.8718 0.0879 4.4823 0.3607 4.3738 0.3488
"b5" 1.0000 0.0000 1.0786 0.0149 0.9060 0.0616 1.8919 0.1009 5.0640 0.3669 4.9012 0.3517
"b6" 1.0000 0.0000 1.0795 0.0152 0.9196 0.0488 1.9042 0.0973 5.5406 0.3960 5.3265 0.3765
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key outside right top vertical Left reverse samplen 1 font ',7'
set xtics rotate by 30 right font ',7'
plot for [i=0:5] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
