#!/bin/sh
# Install the pinned opencode server (npm package opencode-ai) into the repo's
# git-ignored .opencode/ folder, for tests/opencode/test_opencode_real.py.
#
# Idempotent: does nothing if that exact version is already installed there.
# Needs node + npm and access to the npm registry. Prints what it does.
set -eu

VERSION="${OPENCODE_VERSION:-1.18.33}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/.opencode"
BIN="$DEST/node_modules/.bin/opencode"
PKG_JSON="$DEST/node_modules/opencode-ai/package.json"

installed_version() {
    [ -f "$PKG_JSON" ] || return 0
    node -e 'process.stdout.write(require(process.argv[1]).version)' "$PKG_JSON" 2>/dev/null || true
}

if [ -x "$BIN" ] && [ "$(installed_version)" = "$VERSION" ]; then
    echo "install-opencode: opencode-ai@$VERSION already installed at $BIN; nothing to do"
    exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
    echo "install-opencode: npm is not on PATH; install Node.js (with npm) first" >&2
    exit 2
fi

echo "install-opencode: installing opencode-ai@$VERSION into $DEST (about 190 MB) ..."
mkdir -p "$DEST"
# A package.json of its own keeps npm from walking up into the repo.
if [ ! -f "$DEST/package.json" ]; then
    printf '{\n  "name": "opencode-for-tests",\n  "private": true\n}\n' >"$DEST/package.json"
fi
npm install --prefix "$DEST" --save-exact --no-audit --no-fund --loglevel=error \
    "opencode-ai@$VERSION"

if [ ! -x "$BIN" ]; then
    echo "install-opencode: npm finished but $BIN is missing" >&2
    exit 1
fi
echo "install-opencode: installed $("$BIN" --version 2>/dev/null || echo "opencode-ai@$VERSION") at $BIN"
