# The daemons' processes, for start.sh and stop.sh (not sourced by env.sh: a user's shell
# gets no functions of ours).
# running PID...: those still alive, zombies left out: a daemon that exited but whose parent has
# not reaped it yet holds nothing, yet pgrep and kill -0 still see it (seen here: a stopped munged
# stayed a zombie, so the next start thought munged ran and did not start one)
running() {
  local pid
  for pid in "$@"; do
    [ -r "/proc/$pid/stat" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && echo "$pid"
  done
  return 0
}
# live PATTERN: the running pids whose command line matches (pgrep -f)
live() {
  # shellcheck disable=SC2046
  running $(pgrep -f "$1" || true)
}
