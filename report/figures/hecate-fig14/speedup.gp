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
set yrange [0:7.692]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "smartmoe" ci "flexmoe" ci "hecate" ci "hecate-rm" ci
"b1" 1.0000 0.0000 1.0837 0.0000 0.9438 0.0000 1.7758 0.0000 2.4952 0.0000 2.4952 0.0000
"b2" 1.0000 0.0000 1.0888 0.0000 0.9453 0.0000 1.8758 0.0000 3.7303 0.0000 3.7303 0.0000
"b3" 1.0000 0.0000 1.0903 0.0000 0.8839 0.0000 1.9385 0.0000 4.4849 0.0000 4.4095 0.0000
"b4" 1.0000 0.0000 1.0909 0.0000 0.9012 0.0000 1.9491 0.0000 5.4082 0.0000 5.2444 0.0000
"b5" 1.0000 0.0000 1.0928 0.0000 0.9810 0.0000 1.9563 0.0000 6.0456 0.0000 5.8019 0.0000
"b6" 1.0000 0.0000 1.0923 0.0000 0.9496 0.0000 1.9684 0.0000 6.5187 0.0000 6.3500 0.0000
EOD
set style data histograms
set style histogram clustered gap 1
set boxwidth 0.9
set key top left horizontal
set xtics rotate by 20 right
plot for [i=0:5] $data using (column(2+2*i)):xtic(1) title columnheader(2+2*i)
