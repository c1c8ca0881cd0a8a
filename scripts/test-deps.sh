#!/usr/bin/env bash
# Installs, once, what `make test` needs beyond the Go toolchain.
set -euo pipefail
exit 0
