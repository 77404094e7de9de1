#!/usr/bin/env bash
# The srpd .deb, for real: build it (make deb; or take the .deb given as $1), install it with
# dpkg on this machine, check what it installed, reinstall it (the upgrade path of the
# maintainer scripts), remove it, purge it, and check that nothing of it is left but the user
# and group srpd (Debian policy: a package does not delete a system user; files may still
# belong to it). Root, Debian with dpkg; CI (.ci/run) runs it. Refuses to run where srpd is
# installed or where one of the package's files already exists; a failure purges the package.
#
# Checked after installation: srpd and srpctl report the version of the tree (git describe)
# and are static; user srpd; /etc/srpd 0770 and srpd.yaml 0660, group srpd (tmpfiles), the
# file a conffile; `srpd --check -c /etc/srpd/srpd.yaml`, also as user srpd; `systemd-analyze
# verify` of the installed unit, with no output at all; the unit enabled (deb-systemd-helper);
# srpd started as user srpd from the installed configuration answers `srpctl status` on
# /run/srpd/srpd.sock; the unit's ExecReload= command line, run as user srpd, reloads and fails
# on an invalid file; `srpctl --help`; the man pages (man -w) and the completion files.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "deb-check: FAIL: $*" >&2; exit 1; }
step() { echo "deb-check: $*"; }

[ "$(id -u)" = 0 ] || fail "needs root (dpkg -i)"
command -v dpkg >/dev/null || fail "needs dpkg (Debian)"

pkg_status() { dpkg-query -W -f='${db:Status-Abbrev}' srpd 2>/dev/null || true; }
case "$(pkg_status)" in
"" | "un "*) ;;
*) fail "srpd is installed here already ($(pkg_status)): not touching it" ;;
esac

if [ $# -ge 1 ]; then
	deb=$1
else
	step "make deb"
	make --no-print-directory deb >/dev/null
	debs=(dist/srpd_*_amd64.deb)
	{ [ ${#debs[@]} = 1 ] && [ -f "${debs[0]}" ]; } || fail "make deb made ${debs[*]}"
	deb=${debs[0]}
fi
version=$(git describe --always --dirty 2>/dev/null || echo unknown)

# The package's files (not its directories: those it shares with the system stay).
mapfile -t files < <(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { sub(/^\./, "", $6); print $6 }')
[ ${#files[@]} -gt 10 ] || fail "dpkg-deb -c $deb lists ${#files[@]} files"
for f in "${files[@]}"; do
	{ [ ! -e "$f" ] && [ ! -L "$f" ]; } || fail "$f exists already: not installing over it"
done

daemon_pid=""
cleanup() {
	local rc=$?
	if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
	if [ "$rc" != 0 ] && [ -n "$(pkg_status)" ] && [ "$(pkg_status)" != "un " ]; then
		echo "deb-check: purging srpd after the failure" >&2
		dpkg --purge srpd >/dev/null || true
	fi
	exit "$rc"
}
trap cleanup EXIT

step "dpkg -i $deb"
dpkg -i "$deb"
[ "$(pkg_status)" = "ii " ] || fail "srpd: dpkg status $(pkg_status) after dpkg -i"

step "binaries"
[ "$(srpd --version)" = "srpd $version" ] || fail "srpd --version: $(srpd --version), want srpd $version"
[ "$(srpctl --version)" = "srpctl $version" ] || fail "srpctl --version: $(srpctl --version), want srpctl $version"
for b in /usr/sbin/srpd /usr/bin/srpctl; do
	# Static (CGO_ENABLED=0): the package depends on no library.
	if ldd "$b" >/dev/null 2>&1; then fail "$b is dynamically linked: $(ldd "$b" | tr '\n' ' ')"; fi
done
[ -z "$(dpkg-query -W -f='${Depends}${Pre-Depends}' srpd)" ] || fail "Depends: $(dpkg-query -W -f='${Depends}' srpd)"

step "user, /etc/srpd, conffile"
getent passwd srpd | grep -q ':/var/lib/srpd:' || fail "user srpd: $(getent passwd srpd || echo missing)"
[ "$(stat -c '%a %U:%G' /etc/srpd)" = "770 root:srpd" ] || fail "/etc/srpd: $(stat -c '%a %U:%G' /etc/srpd)"
[ "$(stat -c '%a %U:%G' /etc/srpd/srpd.yaml)" = "660 root:srpd" ] || fail "/etc/srpd/srpd.yaml: $(stat -c '%a %U:%G' /etc/srpd/srpd.yaml)"
dpkg-query -W -f='${Conffiles}\n' srpd | grep -q '^ /etc/srpd/srpd.yaml ' || fail "/etc/srpd/srpd.yaml is not a conffile"

step "srpd --check -c /etc/srpd/srpd.yaml"
srpd --check -c /etc/srpd/srpd.yaml
runuser -u srpd -- srpd --check -c /etc/srpd/srpd.yaml >/dev/null || fail "user srpd cannot check its configuration"

step "systemd-analyze verify /lib/systemd/system/srpd.service"
# verify exits 0 on unknown directives and only prints them: any output fails.
out=$(systemd-analyze verify --man=no /lib/systemd/system/srpd.service 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify: $out"
[ -L /etc/systemd/system/multi-user.target.wants/srpd.service ] || fail "srpd.service is not enabled"

step "srpd as user srpd from /etc/srpd/srpd.yaml; srpctl status"
# What the unit's RuntimeDirectory= would make; postrm removes it on purge.
install -d -m 0750 -o srpd -g srpd /run/srpd
log=$(mktemp)
# setpriv execs (runuser would stay as srpd's parent): $! is srpd, ended by its PID.
RUNTIME_DIRECTORY=/run/srpd setpriv --reuid=srpd --regid=srpd --init-groups -- \
	srpd -c /etc/srpd/srpd.yaml --log-format console >"$log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [ -S /run/srpd/srpd.sock ] && break; sleep 0.1; done
status=$(srpctl --timeout 10s status 2>&1) || fail "srpctl status: $status; srpd's log: $(cat "$log")"
grep -q "^Daemon: *srpd $version " <<<"$status" || fail "srpctl status: $status"
[ "$(stat -c '%a %G' /run/srpd/srpd.sock)" = "660 srpd" ] || fail "control socket: $(stat -c '%a %G' /run/srpd/srpd.sock)"
# The unit's ExecReload= as systemd would run it (user srpd): a reload that succeeds, then one
# of a broken file that fails, names the problem and leaves the daemon running as it was.
reload=$(sed -n 's/^ExecReload=//p' /lib/systemd/system/srpd.service)
[ -n "$reload" ] || fail "no ExecReload= in the installed unit"
read -r -a reload_argv <<<"$reload"
out=$(setpriv --reuid=srpd --regid=srpd --init-groups -- "${reload_argv[@]}" 2>&1) || fail "ExecReload ($reload): $out; srpd's log: $(cat "$log")"
cp -p /etc/srpd/srpd.yaml /etc/srpd/srpd.yaml.good
printf 'transports: [{name: lo, driver: nosuch}]\n' >>/etc/srpd/srpd.yaml
if out=$(setpriv --reuid=srpd --regid=srpd --init-groups -- "${reload_argv[@]}" 2>&1); then
	fail "ExecReload of a broken file succeeded: $out"
fi
grep -q 'nosuch\|transports' <<<"$out" || fail "ExecReload of a broken file does not say why: $out"
mv /etc/srpd/srpd.yaml.good /etc/srpd/srpd.yaml
srpctl --timeout 10s status >/dev/null 2>&1 || fail "srpd does not answer after a failed reload; its log: $(cat "$log")"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "srpd exited $? on SIGTERM; its log: $(cat "$log")"
daemon_pid=""
rm -f "$log"

step "srpctl --help, man pages, completion"
# Not `srpctl --help | grep -q`: grep exits at the first match, and srpctl, still writing,
# dies of SIGPIPE, which pipefail turns into a failure (6 runs in 100 here).
grep -q '^srpctl controls a running srpd' <<<"$(srpctl --help)" || fail "srpctl --help"
for page in srpctl srpctl-lun-add 8/srpd; do
	if command -v man >/dev/null; then
		man -w "${page#*/}" >/dev/null || fail "man -w ${page#*/}"
	fi
done
zcat /usr/share/man/man8/srpd.8.gz | grep -q '^\.TH SRPD 8' || fail "srpd.8"
zcat /usr/share/man/man1/srpctl.1.gz | grep -q "^\.TH \"SRPCTL\" \"1\" .*\"srpd $version\"" || fail "srpctl.1 header"
[ ! -e /usr/share/man/man1/srpctl-gen-man.1.gz ] || fail "the hidden gen-man command has a man page"
bash -c 'source /usr/share/bash-completion/completions/srpctl && complete -p srpctl' | grep -q srpctl || fail "bash completion"
head -1 /usr/share/zsh/vendor-completions/_srpctl | grep -q '^#compdef srpctl' || fail "zsh completion"
grep -q 'complete -c srpctl' /usr/share/fish/vendor_completions.d/srpctl.fish || fail "fish completion"

step "reinstall (upgrade path) keeps a changed conffile"
echo "# deb-check: an operator's change" >>/etc/srpd/srpd.yaml
dpkg -i "$deb" >/dev/null
grep -q "deb-check: an operator's change" /etc/srpd/srpd.yaml || fail "reinstalling replaced the changed /etc/srpd/srpd.yaml"
[ "$(stat -c '%a %U:%G' /etc/srpd/srpd.yaml)" = "660 root:srpd" ] || fail "/etc/srpd/srpd.yaml after reinstall: $(stat -c '%a %U:%G' /etc/srpd/srpd.yaml)"

step "dpkg --remove: the configuration stays"
dpkg --remove srpd >/dev/null
[ "$(pkg_status)" = "rc " ] || fail "srpd: dpkg status $(pkg_status) after dpkg --remove"
{ [ ! -e /usr/sbin/srpd ] && [ -e /etc/srpd/srpd.yaml ]; } || fail "after dpkg --remove"

step "dpkg --purge: nothing left"
dpkg --purge srpd >/dev/null
case "$(pkg_status)" in "" | "un "*) ;; *) fail "srpd: dpkg status $(pkg_status) after dpkg --purge" ;; esac
left=()
for f in "${files[@]}" /etc/srpd /run/srpd /var/lib/srpd /etc/systemd/system/multi-user.target.wants/srpd.service \
	/var/lib/systemd/deb-systemd-helper-enabled/srpd.service.dsh-also \
	/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/srpd.service \
	/var/lib/systemd/deb-systemd-helper-masked/srpd.service; do
	if [ -e "$f" ] || [ -L "$f" ]; then left+=("$f"); fi
done
[ ${#left[@]} = 0 ] || fail "left after purge: ${left[*]}"
getent passwd srpd >/dev/null && step "user srpd stays (Debian policy)"
step "PASS: $deb (${#files[@]} files) installed, checked, reinstalled, removed and purged"
