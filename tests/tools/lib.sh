# Shared by the process tests. Background servers run under `timeout`, so the pid a test
# holds is timeout's; SIGKILL on it would orphan the server. stop_tree stops the server
# (timeout's children) and timeout itself: TERM first, KILL after 3 s.
stop_tree() {
  local pid=$1
  [[ -n $pid ]] || return 0
  local kids
  kids=$(pgrep -P "$pid" 2>/dev/null || true)
  kill -TERM $kids "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 $kids "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
