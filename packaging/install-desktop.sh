#!/usr/bin/env bash
# Adds the Vocable bundle to the Linux desktop's application menu (current user only): the
# .desktop entry, with Exec pointing at this bundle, and the icons, under $XDG_DATA_HOME
# (~/.local/share). build.sh copies this script into the bundle; run it from there:
#
#   ./vocable/install-desktop.sh             # after unpacking or moving the bundle, run it again
#   ./vocable/install-desktop.sh --uninstall
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
data="${XDG_DATA_HOME:-$HOME/.local/share}"
apps="$data/applications"
icons="$data/icons/hicolor"
assets="$here/_internal/assets"

if [ "${1:-}" = "--uninstall" ]; then
    rm -f "$apps/vocable.desktop" "$icons/256x256/apps/vocable.png" "$icons/scalable/apps/vocable.svg"
    echo "removed Vocable from the application menu"
else
    [ -x "$here/vocable" ] && [ -f "$assets/vocable.desktop" ] || {
        echo "install-desktop.sh: run the copy inside the bundle (next to the vocable executable)" >&2; exit 1; }
    mkdir -p "$apps" "$icons/256x256/apps" "$icons/scalable/apps"
    cp "$assets/icons/vocable.png" "$icons/256x256/apps/vocable.png"
    cp "$assets/icons/vocable.svg" "$icons/scalable/apps/vocable.svg"
    # Exec names the bundle's absolute path, quoted (spaces are fine; the characters the
    # Desktop Entry spec would need escaped twice are refused rather than half-escaped)
    case "$here" in
        *[\\\"\`\$]*) echo "install-desktop.sh: move the bundle to a path without \\ \" \` or \$" >&2; exit 1 ;;
    esac
    exec_path="${here//%/%%}/vocable"
    while IFS= read -r line; do
        case "$line" in
            Exec=*) printf 'Exec="%s"\n' "$exec_path" ;;
            *) printf '%s\n' "$line" ;;
        esac
    done < "$assets/vocable.desktop" > "$apps/vocable.desktop"
    echo "added Vocable to the application menu ($apps/vocable.desktop)"
fi
command -v update-desktop-database >/dev/null && update-desktop-database -q "$apps" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$icons" || true
