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
set title '2 platforms × 64 GPUs; mixtral-like (4 layers, 8 experts, top-2); 3 routings' font ',5' noenhanced
set ylabel 'Speedup over ep (x)'
set yrange [0:2.870]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "pro-prophet" ci "hecate" ci "smartmoe" ci "flexmoe" ci "eplb" ci
"hgx-h800 naive" 1.0000 0.0000 1.6413 0.0000 1.8412 0.0000 0.9786 0.0000 0.9946 0.0000 1.4859 0.0000 1.4922 0.0000
"hgx-h800 aux-free" 1.0000 0.0000 1.0232 0.0000 0.9984 0.0000 0.9626 0.0000 0.9217 0.0000 0.7586 0.0000 0.8208 0.0000
"hgx-h800 trace" 1.0000 0.0000 1.4749 0.0000 1.5335 0.0000 0.9824 0.0000 0.9824 0.0000 1.4370 0.0000 1.4266 0.0000
"gb200-nvl72 naive" 1.0000 0.0000 2.1132 0.0000 2.4322 0.0000 1.1600 0.0000 0.9962 0.0000 1.7749 0.0000 1.7886 0.0000
"gb200-nvl72 aux-free" 1.0000 0.0000 1.0170 0.0000 0.9980 0.0000 0.9153 0.0000 0.9329 0.0000 0.7767 0.0000 0.8710 0.0000
"gb200-nvl72 trace" 1.0000 0.0000 1.7278 0.0000 1.9710 0.0000 1.6026 0.0000 0.9875 0.0000 1.7212 0.0000 1.7269 0.0000
EOD
set style data histograms
set style histogram clustered gap 1
set boxwidth 0.9
set key outside right top vertical Left reverse samplen 1 font ',7'
set xtics rotate by 30 right font ',7'
plot for [i=0:6] $data using (column(2+2*i)):xtic(1) title columnheader(2+2*i)
