# Plots the experiment programs' results (called by minidl-sweep; also usable by hand):
#   gnuplot -e "datafile='plot.dat'; outfile='plot.png'; plottitle='...'; xlab='batch'; ylab='acc'; logx=1" \
#           tools/plot_results.gnuplot
# datafile holds one block per series (a quoted title line, then "x y" rows), blocks separated by
# two blank lines, so every study's lines come out of this one script. With errbars=1 the rows are
# "x y error": the first nlines blocks are lines with error bars (+-error), the others point sets
# (published values) drawn in the colour of the line numbered by the matching word of pointcolors. minidl-sweep writes the
# data file even where gnuplot is missing (a GPU machine), with the settings on its first line
# ("# plot: plottitle=...; xlab=...; ylab=...; logx=1"); draw such a file later with
#   f=results/keras-batch/keras-batch.png.dat
#   gnuplot -e "datafile='$f'; outfile='${f%.dat}'; $(sed -n 's/^# plot: //p' "$f")" tools/plot_results.gnuplot
# (tools/gpu_studies.sh --plot DIR does this for every .dat in DIR and links the PNG from summary.md).
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
if (!exists("nlines")) nlines = nblocks
if (!errbars) {
  plot for [i=0:nblocks-1] datafile index i using 1:2 with linespoints lw 2 pt 7 title columnheader(1)
} else {
  set offsets graph 0.04, graph 0.04, 0, 0   # error bars and circles at the first and last batch stay inside
  if (nlines < nblocks) {
    plot for [i=0:nlines-1] datafile index i using 1:2:3 with yerrorlines lw 2 pt 7 lc i+1 title columnheader(1), \
         for [i=nlines:nblocks-1] datafile index i using 1:2 with points pt 6 ps 2.5 lw 2 \
           lc (word(pointcolors, i - nlines + 1) + 0) title columnheader(1)
  } else {
    plot for [i=0:nblocks-1] datafile index i using 1:2:3 with yerrorlines lw 2 pt 7 lc i+1 title columnheader(1)
  }
}
