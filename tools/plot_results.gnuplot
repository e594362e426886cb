# Plots the experiment programs' results (called by minidl-sweep; also usable by hand):
#   gnuplot -e "datafile='plot.dat'; outfile='plot.png'; plottitle='...'; xlab='batch'; ylab='acc'; logx=1" \
#           tools/plot_results.gnuplot
# datafile holds one block per series (a quoted title line, then "x y" rows), blocks separated by
# two blank lines, so every study's lines come out of this one script. With errbars=1 the rows are
# "x y error": the first nlines blocks are lines with error bars (+-error), the others (but the
# chance block) point sets (published values) drawn in the colour of the line numbered by the
# matching word of pointcolors. minidl-sweep writes the
# data file even where gnuplot is missing (a GPU machine), with the settings on its first line
# ("# plot: plottitle=...; xlab=...; ylab=...; logx=1"); draw such a file later with
#   f=results/keras-batch/keras-batch.png.dat
#   gnuplot -e "datafile='$f'; outfile='${f%.dat}'; $(sed -n 's/^# plot: //p' "$f")" tools/plot_results.gnuplot
# (python3 -m lab.gpulab plot DIR does this for every .dat in DIR and links the PNG from summary.md).
# Accuracy plots add band_lo, band_hi and chance_block to the settings (see below).
if (!exists("plottitle")) plottitle = ""
if (!exists("xlab")) xlab = "batch size"
if (!exists("ylab")) ylab = ""
if (!exists("logx")) logx = 1
if (!exists("errbars")) errbars = 0
if (!exists("pointcolors")) pointcolors = ""
set terminal pngcairo size 900,560 font "sans,11" noenhanced
set output outfile
set title plottitle
set xlabel xlab
set ylabel ylab
set grid
set key outside right top
if (logx) set logscale x 2
stats datafile using 1 nooutput
nblocks = STATS_blocks
# An accuracy plot's chance band (band_lo, band_hi: 50% +- two binomial standard errors) is shaded;
# with chance_block=1 the last block holds the lines' points inside it, circled in black.
if (!exists("chance_block")) chance_block = 0
if (!exists("nlines")) nlines = nblocks - chance_block
last_points = nblocks - chance_block - 1   # blocks nlines..last_points: point sets
if (errbars) {
  set offsets graph 0.04, graph 0.04, 0, 0   # error bars and circles at the first and last batch stay inside
  cmd = "plot for [i=0:nlines-1] datafile index i using 1:2:3 with yerrorlines lw 2 pt 7 lc i+1 title columnheader(1)"
} else {
  cmd = "plot for [i=0:nlines-1] datafile index i using 1:2 with linespoints lw 2 pt 7 title columnheader(1)"
}
if (last_points >= nlines) {
  cmd = cmd . ", for [i=nlines:last_points] datafile index i using 1:2 with points pt 6 ps 2.5 lw 2" . \
        " lc (word(pointcolors, i - nlines + 1) + 0) title columnheader(1)"
}
if (exists("band_lo")) {
  set object 1 rectangle from graph 0, first band_lo to graph 1, first band_hi behind \
      fillcolor rgb "#dddddd" fillstyle solid 1.0 noborder
  cmd = cmd . ", keyentry with boxes fillcolor rgb '#dddddd' fillstyle solid 1.0 title 'chance band'"
}
if (chance_block) {
  cmd = cmd . ", datafile index nblocks-1 using 1:2 with points pt 6 ps 2.5 lw 2 lc rgb 'black' title columnheader(1)"
}
eval cmd
