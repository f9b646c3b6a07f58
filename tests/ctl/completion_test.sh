#!/usr/bin/env bash
# ctl/tandemctl.bash-completion: commands, subcommands and options complete.
# (Session names and policy keys come from a running daemon; not here.)
set -euo pipefail
source "$1"
complete_line() {  # words...: COMPREPLY for the last word
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _tandemctl
  echo "${COMPREPLY[*]}"
}
fail=0
expect() {  # want got
  if [ "$1" != "$2" ]; then echo "want '$1', got '$2'"; fail=1; fi
}
expect "drain" "$(complete_line tandemctl dr)"
expect "gpu" "$(complete_line tandemctl g)"
expect "status sessions session" "$(complete_line tandemctl s)"
expect "evict kill" "$(complete_line tandemctl session '')"
expect "get set" "$(complete_line tandemctl --json policy '')"
expect "--follow" "$(complete_line tandemctl events --f)"
expect "--interval" "$(complete_line tandemctl top --i)"
expect "--runtime-dir" "$(complete_line tandemctl --run)"
expect "reload" "$(complete_line tandemctl --runtime-dir /tmp rel)"
exit $fail
