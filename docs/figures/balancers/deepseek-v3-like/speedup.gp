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
set title '2 platforms × 64 GPUs; deepseek-v3-like (4 layers, 256 experts, top-8); 3 routings' font ',5' noenhanced
set ylabel 'Speedup over ep (x)'
set yrange [0:5.283]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front
$data << EOD
group "ep" ci "fastermoe" ci "pro-prophet" ci "hecate" ci "smartmoe" ci "flexmoe" ci "eplb" ci
"hgx-h800 naive" 1.0000 0.0000 3.5199 0.0000 3.9467 0.0000 3.8722 0.0000 0.9907 0.0000 2.5385 0.0000 2.9037 0.0000
"hgx-h800 aux-free" 1.0000 0.0000 1.0708 0.0000 0.9614 0.0000 0.8061 0.0000 0.8870 0.0000 0.9252 0.0000 0.8542 0.0000
"hgx-h800 trace" 1.0000 0.0000 3.8552 0.0000 4.4770 0.0000 4.3597 0.0000 2.3894 0.0000 2.8367 0.0000 4.3050 0.0000
"gb200-nvl72 naive" 1.0000 0.0000 2.6452 0.0000 2.9578 0.0000 3.0701 0.0000 1.0645 0.0000 2.4855 0.0000 3.0003 0.0000
"gb200-nvl72 aux-free" 1.0000 0.0000 1.0443 0.0000 0.9796 0.0000 0.9011 0.0000 0.9719 0.0000 0.9660 0.0000 0.9622 0.0000
"gb200-nvl72 trace" 1.0000 0.0000 3.1281 0.0000 3.4483 0.0000 3.9652 0.0000 2.6716 0.0000 2.8957 0.0000 4.2175 0.0000
EOD
set style data histograms
set style histogram clustered gap 1
set boxwidth 0.9
set key outside right top vertical Left reverse samplen 1 font ',7'
set xtics rotate by 30 right font ',7'
plot for [i=0:6] $data using (column(2+2*i)):xtic(1) title columnheader(2+2*i)
