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
set yrange [0:6.985]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "smartmoe" ci "flexmoe" ci "hecate" ci "hecate-rm" ci
"b1" 1.0000 0.0000 1.0579 0.0127 0.9004 0.0437 1.6460 0.0714 2.1638 0.1463 2.1150 0.1419
"b2" 1.0000 0.0000 1.0694 0.0142 0.9127 0.0447 1.7728 0.0798 3.1457 0.2256 3.0422 0.2156
"b3" 1.0000 0.0000 1.0741 0.0144 0.9094 0.0525 1.8328 0.0909 3.9055 0.3070 3.7470 0.2900
"b4" 1.0000 0.0000 1.0772 0.0145 0.9028 0.0438 1.8704 0.0878 4.5395 0.3535 4.3265 0.3312
"b5" 1.0000 0.0000 1.0785 0.0149 0.9061 0.0615 1.8908 0.1008 5.1176 0.3647 4.8486 0.3402
"b6" 1.0000 0.0000 1.0794 0.0151 0.9197 0.0487 1.9032 0.0973 5.5251 0.3944 5.3118 0.3749
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key outside right top vertical Left reverse samplen 1 font ',7'
set xtics rotate by 30 right font ',7'
plot for [i=0:5] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
