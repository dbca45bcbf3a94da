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
set yrange [0:9.794]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "smartmoe" ci "flexmoe" ci "hecate" ci "hecate-rm" ci
"b1" 1.0000 0.0000 1.0677 0.0601 0.8824 0.2146 1.6799 0.3017 2.3911 0.9074 2.3911 0.9074
"b2" 1.0000 0.0000 1.0722 0.0645 0.8827 0.2218 1.7686 0.3067 3.5919 1.2878 3.5919 1.2878
"b3" 1.0000 0.0000 1.0740 0.0639 0.8701 0.2358 1.8155 0.3786 4.3649 1.6301 4.2900 1.5932
"b4" 1.0000 0.0000 1.0752 0.0640 0.8846 0.2027 1.8340 0.3223 5.0349 1.8209 4.8861 1.7524
"b5" 1.0000 0.0000 1.0760 0.0659 0.8817 0.3038 1.8342 0.3672 5.7399 1.9693 5.5097 1.8722
"b6" 1.0000 0.0000 1.0758 0.0661 0.8991 0.2491 1.8519 0.3677 6.1941 2.1060 6.0344 2.0399
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key top left horizontal
set xtics rotate by 20 right
plot for [i=0:5] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
