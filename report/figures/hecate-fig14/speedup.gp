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
set yrange [0:7.680]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "smartmoe" ci "flexmoe" ci "hecate" ci "hecate-rm" ci
"b1" 1.0000 0.0000 1.0606 0.0132 0.8966 0.0454 1.6928 0.0768 2.3070 0.1662 2.3070 0.1662
"b2" 1.0000 0.0000 1.0715 0.0146 0.9105 0.0459 1.8129 0.0841 3.4131 0.2594 3.3983 0.2579
"b3" 1.0000 0.0000 1.0759 0.0148 0.9075 0.0535 1.8694 0.0954 4.2487 0.3532 4.1563 0.3425
"b4" 1.0000 0.0000 1.0789 0.0148 0.9010 0.0446 1.9049 0.0915 4.9514 0.4063 4.7792 0.3869
"b5" 1.0000 0.0000 1.0801 0.0151 0.9045 0.0626 1.9237 0.1049 5.6008 0.4179 5.3461 0.3933
"b6" 1.0000 0.0000 1.0810 0.0154 0.9183 0.0495 1.9349 0.1010 6.0561 0.4524 5.8590 0.4332
EOD
set style data histograms
set style histogram errorbars lw 1 gap 1
set boxwidth 0.9
set key outside right top vertical Left reverse samplen 1 font ',7'
set xtics rotate by 30 right font ',7'
plot for [i=0:5] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)
