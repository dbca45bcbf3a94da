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
set ylabel 'Speedup over ep (x)'
set yrange [0:7.692]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" "fastermoe" "smartmoe" "flexmoe" "hecate" "hecate-rm"
"b1" 1.0000 2.3995 0.9438 1.7758 2.4952 2.4952
"b2" 1.0000 2.7430 0.9453 1.8758 3.7303 3.7303
"b3" 1.0000 3.2229 0.8839 1.9385 4.4849 4.4095
"b4" 1.0000 3.4666 0.9012 1.9491 5.4082 5.2444
"b5" 1.0000 3.8268 0.9810 1.9563 6.0456 5.8019
"b6" 1.0000 3.9775 0.9496 1.9684 6.5187 6.3500
EOD
set style data histograms
set style histogram clustered gap 1
set boxwidth 0.9
set key top left horizontal
set xtics rotate by 20 right
plot for [i=2:7] $data using i:xtic(1) title columnheader(i)
