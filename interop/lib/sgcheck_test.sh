#!/usr/bin/env bash
# Tests of interop/lib/sgcheck.sh (no root, no guest, about a second): sg_verify passes on the
# console of a real `srp-verbs sg-checks` run (testdata/sg-checks.console.txt, recorded
# 2026-12-05: sg3_utils 1.46 in Debian's 6.1 kernel guest against srpd), and each mutation of
# that console that a wrong answer from srpd would produce makes exactly the check it concerns
# fail. Run by scripts/interop.sh before the guest run; exit 0 when every case behaves.
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$DIR/sgcheck.sh"
NAA=6001405abcdef0123456789abcdef012
GOOD="$DIR/testdata/sg-checks.console.txt"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

if out=$(sg_verify "$GOOD" "$NAA"); then
    n=$(grep -c '^  ok ' <<< "$out")
    echo "ok   recorded console: $n checks pass"
    [ "$n" -eq 41 ] || { echo "FAIL recorded console: $n checks ran, want 41 (a check added or lost? update the count)"; fails=$((fails + 1)); }
else
    echo "FAIL recorded console:"; grep FAIL <<< "$out"; fails=$((fails + 1))
fi

# mutant NAME CHECKS SED-SCRIPT: the console edited by SED-SCRIPT must fail exactly CHECKS
# (check names joined by |).
mutant() {
    local name=$1 check=$2 script=$3 out got
    sed -e "$script" "$GOOD" > "$TMP/console"
    if cmp -s "$GOOD" "$TMP/console"; then echo "FAIL $name: the edit changed nothing"; fails=$((fails + 1)); return; fi
    if out=$(sg_verify "$TMP/console" "$NAA"); then
        echo "FAIL $name: sg_verify passed"; fails=$((fails + 1)); return
    fi
    got=$(grep '^  FAIL ' <<< "$out" | sed 's/^  FAIL \([^:]*\):.*/\1/' | tr '\n' '|')
    if [ "$got" = "$check|" ]; then echo "ok   $name: fails '$check' only"
    else echo "FAIL $name: want only '$check' to fail, got '$got'"; fails=$((fails + 1)); fi
}

# Edits are confined to one framed output: /^SG-BEGIN x:/,/^SG-END x /.
mutant "TPGS 0" "inquiry TPGS" '/^SG-BEGIN inq:/,/^SG-END inq /s/TPGS=1/TPGS=0/'
mutant "group 1 non-optimized" "rtpg groups" '/^SG-BEGIN rtpg:/,/^SG-END rtpg /s/state : 0x00 (active\/optimized)/state : 0x01 (active\/non optimized)/'
mutant "peer port 3" "rtpg groups" '/^SG-BEGIN rtpg:/,/^SG-END rtpg /s/^\(    sg| *\)0x02$/\10x03/'
mutant "no extended header" "rtpg extended header" '/Implicit transition time/d'
mutant "other NAA" "vpd 0x83 NAA" '/^SG-BEGIN vpd83:/,/^SG-END vpd83 /s/0x6001405abcdef0123456789abcdef012/0x6001405abcdef0123456789abcdef013/'
mutant "relative port 2" "vpd 0x83 relative target port" 's/Relative target port: 0x1/Relative target port: 0x2/'
mutant "no TPG designator" "vpd 0x83 target port group" '/Target port group: 0x1/d'
mutant "no SIMPSUP" "vpd 0x86 fields" 's/SIMPSUP=1/SIMPSUP=0/'
mutant "mode page length" "mode page 0x01 (code, length, bytes)" '/^SG-BEGIN mode01:/,/^SG-END mode01 /s/01 0a 00 00/01 0b 00 00/'
mutant "RTPG not listed" "opcodes lists Report target port groups" '/^SG-BEGIN opcodes:/,/^SG-END opcodes /{/Report target port groups/d}'
mutant "GET LBA STATUS not listed" "opcodes lists Get LBA status(16)" '/Get LBA status(16)$/d'
mutant "RTPG usage byte 1" "opcodes, one command (RTPG)" 's/Usage data: a3 ff/Usage data: a3 1f/'
mutant "no LU reset" "tmfs" '/^SG-BEGIN tmf:/,/^SG-END tmf /{/Logical unit reset/d}'
mutant "no provisioning page" "log pages" '/^SG-BEGIN logs:/,/^SG-END logs /{/0x0c/d}'
mutant "used count too small" "log page 0x0c used" '/^SG-BEGIN logs0c:/,/^SG-END logs0c /s/resource count: 2328/resource count: 8/'
mutant "hole reported mapped" "lba status from 0" '/^SG-BEGIN lba-first:/,/^SG-END lba-first /s/0x0000000000000008  blocks:          8  deallocated/0x0000000000000008  blocks:          8  mapped/'
mutant "middle mapped" "lba status from 65536" 's/blocks:      65528  deallocated/blocks:      65528  mapped (or unknown)/'
mutant "report type ignored" "lba status, mapped only (report type 2)" '/^SG-BEGIN lba-mapped:/,/^SG-END lba-mapped /s/0x0000000000000010  blocks:        128  mapped (or unknown)/0x0000000000000008  blocks:          8  deallocated/'
mutant "report type refused" "lba-deallocated|lba status, deallocated only (report type 3)" '/^SG-BEGIN lba-deallocated:/,/^SG-END lba-deallocated /{/LBA: 0x/d;s/rc=0/rc=5/}'
mutant "report type not flagged" "lba status RTP for report types 0, 2, 3" '/^SG-BEGIN lba-mapped:/,/^SG-END lba-mapped /s/RTP=1/RTP=0/'
mutant "no unit attention" "unit attention after -> standby" '/^SG-BEGIN ua-standby:/,/^SG-END ua-standby /s/70 00 06 00/70 00 02 00/'
mutant "still active" "rtpg after -> standby" '/^SG-BEGIN rtpg-standby:/,/^SG-END rtpg-standby /s/0x02 (standby)/0x00 (active\/optimized)/'
mutant "standby TUR 04/0A" "test unit ready in standby (status, sense)" '/^SG-BEGIN turs-standby:/,/^SG-END turs-standby /s/04 0b 00 00/04 0a 00 00/'
mutant "standby READ served" "standby, READ (sense)" '/^SG-BEGIN sb-read:/,/^SG-END sb-read /{/70 00 02 00/d}'
mutant "standby REPORT LUNS refused" "sb-luns" '/^SG-END sb-luns /s/rc=0/rc=2/'
mutant "not back" "rtpg after -> active/optimized" '/^SG-BEGIN rtpg-active-optimized:/,/^SG-END rtpg-active-optimized /s/0x00 (active\/optimized)/0x02 (standby)/'
mutant "TUR fails when active" "turs-active-optimized" '/^SG-END turs-active-optimized /s/rc=0/rc=2/'
mutant "an output missing" "vpd86|vpd 0x86 fields" '/^SG-BEGIN vpd86:/,/^SG-END vpd86 /d'

echo "sgcheck_test: $fails failed"
[ "$fails" = 0 ]
