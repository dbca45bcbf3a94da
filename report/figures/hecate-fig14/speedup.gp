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
set yrange [0:6.811]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "smartmoe" ci "flexmoe" ci "hecate" ci "hecate-rm" ci
"b1" 1.0000 0.0000 1.0768 0.0128 0.9035 0.0432 1.3844 0.0486 2.1560 0.1442 2.1183 0.1408
"b2" 1.0000 0.0000 1.0870 0.0142 0.9151 0.0441 1.4647 0.0567 3.1156 0.2206 3.0301 0.2125
"b3" 1.0000 0.0000 1.0913 0.0145 0.9116 0.0517 1.4955 0.0522 3.8481 0.2986 3.7134 0.2844
"b4" 1.0000 0.0000 1.0945 0.0146 0.9050 0.0432 1.5117 0.0516 4.4548 0.3419 4.2721 0.3223
"b5" 1.0000 0.0000 1.0958 0.0150 0.9081 0.0608 1.5289 0.0539 4.9436 0.3526 4.8113 0.3405
"b6" 1.0000 0.0000 1.0968 0.0153 0.9215 0.0481 1.5409 0.0620 5.3929 0.3793 5.2163 0.3648
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key outside right top vertical Left reverse samplen 1 font ',7'
set xtics rotate by 30 right font ',7'
plot for [i=0:5] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
