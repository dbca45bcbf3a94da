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
set yrange [0:9.188]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "smartmoe" ci "flexmoe" ci "hecate" ci "hecate-rm" ci
"b1" 1.0000 0.0000 1.0514 0.0541 0.8848 0.2037 1.6197 0.2841 2.2390 0.7718 2.2390 0.7718
"b2" 1.0000 0.0000 1.0629 0.0612 0.8844 0.2170 1.7281 0.2968 3.3259 1.1266 3.3115 1.1203
"b3" 1.0000 0.0000 1.0674 0.0621 0.8716 0.2307 1.7847 0.3689 4.0647 1.4605 3.9778 1.4197
"b4" 1.0000 0.0000 1.0702 0.0626 0.8855 0.1999 1.8101 0.3165 4.7089 1.6492 4.5488 1.5785
"b5" 1.0000 0.0000 1.0719 0.0647 0.8824 0.3011 1.8147 0.3610 5.3867 1.8010 5.1444 1.7021
"b6" 1.0000 0.0000 1.0724 0.0652 0.8996 0.2469 1.8348 0.3625 5.8413 1.9455 5.6527 1.8695
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key outside right top vertical Left reverse samplen 1 font ',7'
set xtics rotate by 30 right font ',7'
plot for [i=0:5] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
