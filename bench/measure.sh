# Sourced by the bench scripts. measure LOG COMMAND...: runs COMMAND under /usr/bin/time -v
# (stdout to LOG.out, stderr and the report to LOG.time) and prints
# "wall_seconds peak_rss_kib minor_page_faults".
measure() {
  local log=$1
  shift
  /usr/bin/time -v "$@" > "$log.out" 2> "$log.time"
  awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0;
                for (i = 1; i <= n; i++) s = s * 60 + t[i]; wall = s}
              /Maximum resident set size/ {rss = $2}
              /Minor \(reclaiming a frame\) page faults/ {faults = $2}
              END {print wall, rss, faults}' "$log.time"
}
