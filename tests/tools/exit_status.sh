#!/bin/sh
# exit_status.sh ok|error COMMAND [ARG...]: runs COMMAND, its output passed through, and
# then prints "exit_status: ..." (which the CLI tests' FAIL_REGULAR_EXPRESSION catches)
# unless it exited as expected: with 0 for ok, with 1 to 127 for error (an error it
# reported, not a crash by signal). A PASS_REGULAR_EXPRESSION test ignores the exit code
# by itself; this puts it back.
want=$1
shift
"$@"
rc=$?
case $want in
  ok) [ "$rc" -eq 0 ] || echo "exit_status: exited with $rc, expected 0" ;;
  error) [ "$rc" -ge 1 ] && [ "$rc" -lt 128 ] || echo "exit_status: exited with $rc, expected an error exit (1 to 127)" ;;
  *) echo "exit_status: the first argument must be ok or error, not '$want'" ;;
esac
exit 0
