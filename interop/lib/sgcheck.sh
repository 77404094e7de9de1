# shellcheck shell=bash
# The host side of `srp-verbs sg-checks`: the sg3_utils (1.46) outputs the guest framed on its
# console (guest/sgchecks.sh: "SG-BEGIN NAME: CMD", "    sg| " lines, "SG-END NAME rc=N"),
# parsed field by field and compared with what scripts/interop-srpd.sh target-alua configures
# (ALUA group 1 with relative port 1, peer group 2 with relative port 2; a 64 MiB sparse file
# LUN with the NAA SG_NAA) and what the guest's workload wrote (guest/initiator.sh regions:
# 4 KiB at 0, 64 KiB at 8 KiB, 64 KiB at 1 MiB + 4 KiB, 1 MiB at 4 MiB + 12 KiB, the last 4 KiB).
# Sourced by interop/srp-verbs; interop/lib/sgcheck_test.sh runs sg_verify on recorded outputs.

# sg_outputs CONSOLE: every framed output, as "== NAME: CMD (rc=N)" and its lines indented by two.
sg_outputs() {
    tr -d '\r' < "$1" | awk '
        /^SG-BEGIN / { name = $2; sub(/:$/, "", name); cmd = $0; sub(/^SG-BEGIN [^ ]* /, "", cmd); body = ""; next }
        /^SG-END / { rc = $3; sub(/rc=/, "", rc); print "== " name ": " cmd " (rc=" rc ")"; printf "%s", body; body = ""; name = ""; next }
        name != "" && /^    sg\| / { sub(/^    sg\| /, ""); body = body "  " $0 "\n" }'
}

# Over SG_OUT (sg_outputs' text): NAME's lines (unindented) and exit status ("" if absent).
sg_body() { awk -v n="$1" 'index($0, "== " n ": ") == 1 { on = 1; next } /^== / { on = 0 } on { sub(/^  /, ""); print }' <<< "$SG_OUT"; }
sg_rc() { awk -v n="$1" 'index($0, "== " n ": ") == 1 { s = $NF; gsub(/[^0-9]/, "", s); print s; exit }' <<< "$SG_OUT"; }

# The awk helpers the parsers share: hex() of "0x0a"/"0a" and norm() of a hex number (no 0x,
# no leading zeros, lower case).
SG_AWK_LIB='
function hex(s,   i, c, v) { s = tolower(s); sub(/^0x/, "", s); v = 0
    for (i = 1; i <= length(s); i++) { c = index("0123456789abcdef", substr(s, i, 1)); if (c == 0) return -1; v = v * 16 + c - 1 }
    return v }
function norm(s) { s = tolower(s); sub(/^0x/, "", s); sub(/^0+/, "", s); return s == "" ? "0" : s }'

# sg_rtpg_groups NAME: one line per target port group of sg_rtpg --decode's output:
#   g=GROUP state=NAME code=STATE status=STATUS ports=P1,P2
sg_rtpg_groups() {
    sg_body "$1" | awk "$SG_AWK_LIB"'
        function flush() { if (g != "") print "g=" g " state=" st " code=" code " status=" stat " ports=" ports; g = ""; ports = "" }
        /target port group id *:/ { flush(); s = $0; sub(/.*id *: */, "", s); sub(/ *,.*/, "", s); g = norm(s); inports = 0; next }
        /asymmetric access state *:/ { s = $0; sub(/.*state *: */, "", s); sub(/ .*/, "", s); code = norm(s)
            st = $0; sub(/.*\(/, "", st); sub(/\).*/, "", st); gsub(/ /, "_", st); next }
        /status code *:/ { s = $0; sub(/.*code *: */, "", s); sub(/ .*/, "", s); stat = norm(s); next }
        /Relative target port ids:/ { inports = 1; next }
        inports && /^ *0x[0-9a-fA-F]+ *$/ { s = $1; ports = ports (ports == "" ? "" : ",") norm(s); next }
        END { flush() }'
}

# sg_vpd83_designators NAME: SECTION|TYPE|VALUE per designator of sg_vpd --page=0x83, e.g.
#   lu|NAA|6001405abcdef0123456789abcdef012, port|Relative target port|1, port|Target port group|1
sg_vpd83_designators() {
    sg_body "$1" | awk "$SG_AWK_LIB"'
        /^  Addressed logical unit:/ { sec = "lu"; next }
        /^  Target port:/ { sec = "port"; next }
        /^  Target device that contains addressed lu:/ { sec = "device"; next }
        /designator type:/ { t = $0; sub(/.*designator type: */, "", t); sub(/, *code set.*/, "", t); want = 1; next }
        want && t == "NAA" && /^ *0x[0-9a-fA-F]+ *$/ { print sec "|NAA|" tolower(substr($1, 3)); want = 0; next }
        want && /Relative target port: *0x/ { print sec "|" t "|" norm($NF); want = 0; next }
        want && /Target port group: *0x/ { print sec "|" t "|" norm($NF); want = 0; next }
        want && /vendor id:/ { v = $0; sub(/.*vendor id: */, "", v); sub(/ *$/, "", v); print sec "|" t "|" v; want = 0; next }'
}

# sg_kv NAME: the KEY=VALUE pairs of NAME's output, one per line (sg_vpd --page=0x86, sg_rtpg).
sg_kv() { sg_body "$1" | grep -oE '\[?[A-Za-z_0-9]+\]?=[0-9]+' | tr -d '[]'; }

# sg_opcode_rows NAME: "OP[/SA] NAME" per row of sg_opcodes' table (op and sa without 0x).
sg_opcode_rows() {
    sg_body "$1" | awk "$SG_AWK_LIB"'
        /^-+$/ { on = 1; next }
        on && $1 ~ /^[0-9a-f][0-9a-f]$/ {
            if ($3 ~ /^[0-9]+,[0-9]+$/) { key = $1; i = 4 } else { key = $1 "/" norm($2); i = 5 }
            n = $i; for (j = i + 1; j <= NF; j++) n = n " " $j
            print key " " n }'
}

# sg_tmfs NAME: the task management functions sg_opcodes --tmf lists, one per line.
# With --repd, the extended parameter data after them is not listed.
sg_tmfs() { sg_body "$1" | awk '/supported by device:/ { on = 1; next } /:$/ { on = 0 } on && NF { sub(/^ */, ""); print }'; }

# sg_log_pages NAME: the pages (and subpages) sg_logs lists as supported: "0x00", "0x00,0xff".
sg_log_pages() { sg_body "$1" | awk '/^Supported log pages/ { on = 1; next } on && $1 ~ /^0x/ { print $1 }'; }

# sg_lba_descs NAME: "LBA BLOCKS STATUS" per GET LBA STATUS descriptor (decimal; status mapped,
# deallocated, anchored, ...).
sg_lba_descs() {
    sg_body "$1" | awk "$SG_AWK_LIB"'
        /^\[[0-9]+\] LBA: 0x/ { print hex($3), $5, $6 }'
}

# sg_sense NAME: "KEY ASC ASCQ" (two hex digits each) from the raw sense data sg3_utils prints
# with -vv (fixed or descriptor format); nothing without it.
sg_sense() {
    sg_body "$1" | awk "$SG_AWK_LIB"'
        /Raw sense data/ { on = 1; next }
        on && /^ *([0-9a-f][0-9a-f] *)+$/ { for (i = 1; i <= NF; i++) b[n++] = hex($i); next }
        on { on = 0 }
        END { if (n < 4) exit
            if (b[0] % 128 == 112 || b[0] % 128 == 113) { if (n < 14) exit; printf "%02x %02x %02x\n", b[2] % 16, b[12], b[13] }
            else printf "%02x %02x %02x\n", b[1] % 16, b[2], b[3] }'
}

# sg_verify CONSOLE NAA: every check, "  ok   WHAT: detail" or "  FAIL WHAT: detail"; fails
# (status 1) if one failed or an output is missing.
sg_verify() {
    local naa=$2 fails=0 v want got
    SG_OUT=$(sg_outputs "$1")
    sgv_ok() { echo "  ok   $1: $2"; }
    sgv_bad() { echo "  FAIL $1: $2"; fails=$((fails + 1)); }
    sgv_check() { if [ "$2" = "$3" ]; then sgv_ok "$1" "$(echo "$3" | tr "\n" ";" | sed "s/;$//")"; else sgv_bad "$1" "want '$2', got '$(echo "$3" | tr '\n' ';')'"; fi; }
    sgv_rc0() { [ "$(sg_rc "$1")" = 0 ] || sgv_bad "$1" "exit status '$(sg_rc "$1")', want 0"; }

    for v in inq rtpg rtpg-ext vpd83 vpd86 mode01 opcodes opcode-rtpg tmf tmf-repd logs logs-all logs0c \
             lba-first lba-middle lba-last lba-mapped lba-deallocated rtpg-standby rtpg-active-optimized turs-active-optimized; do
        sgv_rc0 "$v"
    done

    # INQUIRY: implicit ALUA only (TPGS 01b).
    sgv_check "inquiry TPGS" "TPGS=1" "$(sg_kv inq | grep '^TPGS=')"

    # REPORT TARGET PORT GROUPS: group 1 (this port, relative port 1) active/optimized; the
    # peer group 2 (relative port 2) active/non-optimized; no transition yet (status 0).
    want="g=1 state=active/optimized code=0 status=0 ports=1
g=2 state=active/non_optimized code=1 status=0 ports=2"
    sgv_check "rtpg groups" "$want" "$(sg_rtpg_groups rtpg)"
    sgv_check "rtpg extended groups" "$want" "$(sg_rtpg_groups rtpg-ext)"
    # The extended header (PARAMETER DATA FORMAT 001b, what the kernel's scsi_dh_alua asks
    # for): sg_rtpg prints the implicit transition time only when the format field says 001b.
    sgv_check "rtpg extended header" "Implicit transition time: 0" "$(sg_body rtpg-ext | grep -m1 'Implicit transition time' | sed 's/^ *//')"
    sgv_check "rtpg supported states" "T_SUP=1 O_SUP=0 LBD_SUP=0 U_SUP=1 S_SUP=1 AN_SUP=1 AO_SUP=1" \
        "$(sg_body rtpg | grep -m1 'T_SUP' | tr -d ' ' | tr ',' ' ' | sed 's/:/=/g')"

    # VPD 0x83: the LUN's NAA, this port's relative target port and target port group.
    got=$(sg_vpd83_designators vpd83)
    sgv_check "vpd 0x83 NAA" "lu|NAA|$naa" "$(grep '|NAA|' <<< "$got")"
    sgv_check "vpd 0x83 relative target port" "port|Relative target port|1" "$(grep '|Relative target port|' <<< "$got")"
    sgv_check "vpd 0x83 target port group" "port|Target port group|1" "$(grep '|Target port group|' <<< "$got")"

    # VPD 0x86 (Extended INQUIRY data) decodes: simple, ordered and head-of-queue task
    # attributes, a volatile cache, no protection information, no microcode download.
    got=$(sg_kv vpd86 | grep -E '^(ACTIVATE_MICROCODE|SPT|GRD_CHK|APP_CHK|REF_CHK|HEADSUP|ORDSUP|SIMPSUP|WU_SUP|NV_SUP|V_SUP|LUICLR)=' | tr '\n' ' ')
    sgv_check "vpd 0x86 fields" "ACTIVATE_MICROCODE=0 SPT=0 GRD_CHK=0 APP_CHK=0 REF_CHK=0 HEADSUP=1 ORDSUP=1 SIMPSUP=1 WU_SUP=0 NV_SUP=0 V_SUP=1 LUICLR=0 " "$got"

    # Mode page 0x01 (read-write error recovery): page code 01h, page length 0Ah.
    got=$(sg_body mode01 | awk '/>> Read-Write error recovery/ { on = 1; next } on && /^ *00 / { print $2, $3, NF - 1; exit }')
    sgv_check "mode page 0x01 (code, length, bytes)" "01 0a 12" "$got"

    # REPORT SUPPORTED OPERATION CODES: the new commands are listed.
    got=$(sg_opcode_rows opcodes)
    for want in "a3/a Report target port groups" "4d Log sense" "9e/12 Get LBA status(16)" \
                "a3/c Report supported operation codes" "a3/d Report supported task management functions"; do
        sgv_check "opcodes lists ${want#* }" "$want" "$(grep -xF "$want" <<< "$got")"
    done
    # The one-command form (REPORTING OPTIONS 011b) for RTPG: supported, and its CDB usage
    # data: 12 bytes, the opcode, every bit of byte 1 (parameter data format and service action).
    got=$(sg_body opcode-rtpg | awk "$SG_AWK_LIB"'
        /Opcode=/ { split($1, a, "="); split($2, b, "="); op = hex(a[2]); sa = hex(b[2]) }
        /Command is supported/ { sup = "supported" }
        /Usage data:/ { n = NF - 2; u = $3 " " $4 }
        END { printf "%02x/%x %s cdb=%d usage=%s\n", op, sa, sup, n, u }')
    sgv_check "opcodes, one command (RTPG)" "a3/a supported cdb=12 usage=a3 ff" "$got"

    # REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS, short and extended (REPD) forms.
    want="Abort task
Abort task set
Clear task set
Logical unit reset"
    sgv_check "tmfs" "$want" "$(sg_tmfs tmf)"
    sgv_check "tmfs (repd)" "$want" "$(sg_tmfs tmf-repd)"
    sgv_check "tmfs (repd) extended parameter data" "Extended parameter data:" "$(sg_body tmf-repd | grep -m1 'Extended parameter data' | sed 's/^ *//')"

    # LOG SENSE: the supported pages, with subpages, and the provisioning page's counts
    # (blocks: threshold exponent 0): used at least what the workload wrote (2312 blocks).
    sgv_check "log pages" "0x00 0x0c " "$(sg_log_pages logs | tr '\n' ' ')"
    sgv_check "log pages and subpages" "0x00 0x00,0xff 0x0c " "$(sg_log_pages logs-all | tr '\n' ' ')"
    v=$(sg_body logs0c | awk -F: '/Used LBA mapping/ { gsub(/ /, "", $2); print $2; exit }')
    if [ -n "$v" ] && [ "$v" -ge 2312 ] && [ "$v" -le 131072 ]; then sgv_ok "log page 0x0c used" "$v blocks"; else sgv_bad "log page 0x0c used" "'$v', want 2312..131072"; fi
    v=$(sg_body logs0c | awk -F: '/Available LBA mapping/ { gsub(/ /, "", $2); print $2; exit }')
    if [ -n "$v" ] && [ "$v" -gt 0 ]; then sgv_ok "log page 0x0c available" "$v blocks"; else sgv_bad "log page 0x0c available" "'$v', want > 0"; fi

    # GET LBA STATUS on the sparse file: 512-byte blocks, the workload's regions mapped, the
    # rest deallocated (at the host file system's 4 KiB granularity).
    sgv_check "lba status from 0" "0 8 mapped
8 8 deallocated
16 128 mapped
144 1912 deallocated
2056 128 mapped
2184 6032 deallocated" "$(sg_lba_descs lba-first)"
    sgv_check "lba status from 65536" "65536 65528 deallocated
131064 8 mapped" "$(sg_lba_descs lba-middle)"
    sgv_check "lba status of the last 4 KiB" "131064 8 mapped" "$(sg_lba_descs lba-last)"
    sgv_check "lba status, mapped only (report type 2)" "0 8 mapped
16 128 mapped
2056 128 mapped
8216 2048 mapped
131064 8 mapped" "$(sg_lba_descs lba-mapped)"
    # RTP (report type processed) set only for the filtered answers.
    sgv_check "lba status RTP for report types 0, 2, 3" "RTP=0 RTP=1 RTP=1" \
        "$(for v in lba-first lba-mapped lba-deallocated; do sg_body "$v" | grep -m1 -oE '^RTP=[0-9]+'; done | tr '\n' ' ' | sed 's/ $//')"
    sgv_check "lba status, deallocated only (report type 3)" "8 8 deallocated
144 1912 deallocated
2184 6032 deallocated
10264 120800 deallocated" "$(sg_lba_descs lba-deallocated)"

    # Live: standby. The first command after the change gets ASYMMETRIC ACCESS STATE CHANGED
    # (06/2A/06), RTPG shows group 1 standby with status 02h (implicit transition), TEST UNIT
    # READY gets NOT READY, LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE (02/04/0B).
    sgv_check "unit attention after -> standby" "06 2a 06" "$(sg_sense ua-standby)"
    sgv_check "rtpg after -> standby" "g=1 state=standby code=2 status=2 ports=1
g=2 state=active/non_optimized code=1 status=0 ports=2" "$(sg_rtpg_groups rtpg-standby)"
    sgv_check "test unit ready in standby (status, sense)" "2 02 04 0b" "$(sg_rc turs-standby) $(sg_sense turs-standby)"
    # What standby still answers (INQUIRY, REPORT LUNS, READ CAPACITY, LOG SENSE, MODE SENSE)
    # and what it refuses (media access: GET LBA STATUS, READ) with 02/04/0B.
    for v in sb-inq sb-luns sb-readcap sb-logs0c sb-mode01; do sgv_rc0 "$v"; done
    sgv_check "standby, INQUIRY" "TPGS=1" "$(sg_kv sb-inq | grep '^TPGS=')"
    sgv_check "standby, REPORT LUNS" "0000000000000000" "$(sg_body sb-luns | awk '/^Report luns/ { on = 1; next } on && NF { print $1 }')"
    sgv_check "standby, READ CAPACITY(16)" "Number of logical blocks=131072" "$(sg_body sb-readcap | grep -oE 'Number of logical blocks=[0-9]+')"
    sgv_check "standby, LOG SENSE 0x0c" "Logical block provisioning page [0xc]" "$(sg_body sb-logs0c | grep -m1 -oE 'Logical block provisioning page +\[0xc\]' | tr -s ' ')"
    sgv_check "standby, MODE SENSE page 0x01" "01 0a 12" "$(sg_body sb-mode01 | awk '/>> Read-Write error recovery/ { on = 1; next } on && /^ *00 / { print $2, $3, NF - 1; exit }')"
    sgv_check "standby, GET LBA STATUS (status, sense)" "2 02 04 0b" "$(sg_rc sb-lba) $(sg_sense sb-lba)"
    sgv_check "standby, READ (sense)" "02 04 0b" "$(sg_sense sb-read)"
    # And back to active/optimized: TEST UNIT READY passes.
    sgv_check "unit attention after -> active/optimized" "06 2a 06" "$(sg_sense ua-active-optimized)"
    sgv_check "rtpg after -> active/optimized" "g=1 state=active/optimized code=0 status=2 ports=1
g=2 state=active/non_optimized code=1 status=0 ports=2" "$(sg_rtpg_groups rtpg-active-optimized)"

    echo "  sg checks: $fails failed"
    [ "$fails" = 0 ]
}
