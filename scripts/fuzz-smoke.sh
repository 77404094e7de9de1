#!/usr/bin/env bash
# make fuzz-smoke: every fuzz target of the module, count-based, within a total time budget.
#
# Each target (every `func FuzzX(f *testing.F)` in the packages' test files) is fuzzed for FUZZ_EXECS executions
# (a count: a time-based -fuzztime can fail at its own deadline on Go 1.26, golang/go#75804)
# while the budget of FUZZ_BUDGET seconds lasts; once it is spent, the remaining targets still
# run their seed corpus and testdata/fuzz entries (`go test -run '^FuzzX$'`), so none is skipped
# silently. One summary line per target at the end; exit 1 if any failed. A per-input hang is
# failed by internal/fuzzbound; FUZZ_TARGET_TIMEOUT bounds a whole target run besides.
#
# Settings (environment): GO, PKGS (default ./...), FUZZ_BUDGET (seconds, default 420),
# FUZZ_EXECS (default 20000x), FUZZ_PARALLEL (fuzzing workers, default 2, at most 2 here: the CI
# machine has 2 cores), FUZZ_TARGET_TIMEOUT (go test -timeout per target, default 10m).
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
PKGS=${PKGS:-./...}
FUZZ_BUDGET=${FUZZ_BUDGET:-420}
FUZZ_EXECS=${FUZZ_EXECS:-20000x}
FUZZ_PARALLEL=${FUZZ_PARALLEL:-2}
FUZZ_TARGET_TIMEOUT=${FUZZ_TARGET_TIMEOUT:-10m}

case $FUZZ_BUDGET in '' | *[!0-9]*) echo "fuzz-smoke: FUZZ_BUDGET must be whole seconds, not '$FUZZ_BUDGET'" >&2; exit 2 ;; esac
case $FUZZ_EXECS in *[0-9]x) ;; *) echo "fuzz-smoke: FUZZ_EXECS must be a count like 20000x, not '$FUZZ_EXECS'" >&2; exit 2 ;; esac
case $FUZZ_PARALLEL in '' | *[!0-9]* | 0) echo "fuzz-smoke: FUZZ_PARALLEL must be a positive number" >&2; exit 2 ;; esac
if [ "$FUZZ_PARALLEL" -gt 2 ]; then
  echo "fuzz-smoke: FUZZ_PARALLEL=$FUZZ_PARALLEL capped at 2 (2-core CI machine)" >&2
  FUZZ_PARALLEL=2
fi

logdir=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-smoke.XXXXXX")
trap 'rm -rf "$logdir"' EXIT

# The targets: `func FuzzX(f *testing.F)` in each package's test files as go list reports them
# (so build constraints apply), without building every test binary first as `go test -list`
# would (about 90 s here); each target's own go test run below compiles its package.
if ! $GO list -f '{{.ImportPath}}{{range .TestGoFiles}} {{$.Dir}}/{{.}}{{end}}{{range .XTestGoFiles}} {{$.Dir}}/{{.}}{{end}}' \
  $PKGS >"$logdir/list" 2>&1; then
  cat "$logdir/list" >&2
  echo "fuzz-smoke: FAILED: go list $PKGS" >&2
  exit 1
fi
targets=()
while read -r pkg files; do
  [ -n "$files" ] || continue
  # shellcheck disable=SC2086 # files is a list of paths without spaces (module directories)
  for n in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*\*testing\.F).*/\1/p' $files | sort -u); do
    targets+=("$pkg $n")
  done
done <"$logdir/list"
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz-smoke: FAILED: no fuzz targets found in $PKGS" >&2
  exit 1
fi
echo "fuzz-smoke: ${#targets[@]} targets, $FUZZ_EXECS execs each with $FUZZ_PARALLEL workers while ${FUZZ_BUDGET}s last, then corpus only"

start=$(date +%s)
summary=()
failed=0
i=0
for t in "${targets[@]}"; do
  pkg=${t% *}
  f=${t#* }
  i=$((i + 1))
  log="$logdir/$i.log"
  t0=$(date +%s)
  if [ $((t0 - start)) -lt "$FUZZ_BUDGET" ]; then
    echo "== [$i/${#targets[@]}] $pkg $f: fuzzing"
    $GO test -run '^$' -fuzz "^$f\$" -fuzztime "$FUZZ_EXECS" -parallel "$FUZZ_PARALLEL" \
      -timeout "$FUZZ_TARGET_TIMEOUT" "$pkg" >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    execs=$(grep -o 'execs: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    if [ $rc -eq 0 ]; then
      summary+=("fuzzed ${execs:-?} execs (${secs}s)  $pkg $f")
    else
      summary+=("FAILED fuzzing after ${execs:-0} execs (${secs}s)  $pkg $f")
    fi
  else
    echo "== [$i/${#targets[@]}] $pkg $f: budget spent, corpus only"
    $GO test -run "^$f\$" -timeout "$FUZZ_TARGET_TIMEOUT" "$pkg" >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then
      summary+=("corpus only (${secs}s)  $pkg $f")
    else
      summary+=("FAILED on its corpus (${secs}s)  $pkg $f")
    fi
  fi
  if [ $rc -ne 0 ]; then
    failed=$((failed + 1))
    # The failing input, if fuzzing found one, is now in the package's testdata/fuzz/$f/.
    echo "---- $pkg $f (exit $rc), last 60 lines:"
    tail -n 60 "$log"
    echo "----"
  fi
done

total=$(($(date +%s) - start))
echo
echo "fuzz-smoke summary (${total}s, budget ${FUZZ_BUDGET}s):"
for s in "${summary[@]}"; do echo "  $s"; done
if [ $failed -ne 0 ]; then
  echo "fuzz-smoke: FAILED: $failed of ${#targets[@]} targets" >&2
  exit 1
fi
echo "fuzz-smoke: ok: ${#targets[@]} targets"
