#!/bin/sh
# The Debian version of the source tree, for `make deb`: from a tag v1.2.3, 1.2.3 (commits
# after it: 1.2.3+git4.abcdef0); without one, 0.0~gitYYYYMMDDhhmmss.abcdef0 from the commit's
# time (UTC), so that later commits sort later and any release (0.1, ...) sorts above. A
# tree with uncommitted changes gets .dirty.
set -eu
dirty=
git diff --quiet HEAD 2>/dev/null || dirty=.dirty
if d=$(git describe --tags --match 'v[0-9]*' 2>/dev/null); then
	echo "$d" | sed -E 's/^v//; s/-([0-9]+)-g([0-9a-f]+)$/+git\1.\2/; s/-(alpha|beta|rc)/~\1/'"; s/\$/$dirty/"
else
	when=$(TZ=UTC0 git log -1 --date=format-local:%Y%m%d%H%M%S --format=%cd)
	echo "0.0~git$when.$(git rev-parse --short HEAD)$dirty"
fi
