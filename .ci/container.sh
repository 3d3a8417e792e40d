#!/usr/bin/env bash
# A private Docker engine for the container tests, and the local base image they build on.
#
#   .ci/container.sh install        apt-get Debian's docker.io, debootstrap and docker-compose
#                                   when missing
#   .ci/container.sh start DIR      start dockerd with all its state in DIR; prints the
#                                   `export DOCKER_HOST=...` line to eval
#   .ci/container.sh base           make debian:bookworm-slim in that engine (cached)
#   .ci/container.sh stop DIR       stop the dockerd started in DIR and delete DIR
#
# No container registry can be reached, so the images' FROM (debian:bookworm-slim) is made
# here: `debootstrap --variant=minbase bookworm`, the same Debian release and packages that
# image is cut from, imported with `docker import` under that name. The root file system
# is cached as a tarball (STATEFEED_BASE_CACHE, default /var/cache/statefeed), so only the
# first run on a machine pays for debootstrap; every later one imports it in seconds.
#
# The engine sets up no bridge, NAT or iptables rules: builds and containers use the
# host's network (`--network host`), and so reach the test database and the handlers the
# tests serve on 127.0.0.1. The client may have no buildx plugin, so builds use the
# classic builder (DOCKER_BUILDKIT=0).
set -euo pipefail

BASE_IMAGE=debian:bookworm-slim
# What the base has beyond minbase: the CA certificates, so that pip in a build trusts the
# same certificate authorities as this machine (whose CA bundle is copied in). Python is
# not in it, as it is not in the registry's debian:bookworm-slim: the Dockerfiles install
# Debian's python3 themselves.
BASE_PACKAGES=ca-certificates
BASE_SUITE=bookworm
BASE_MIRROR=${STATEFEED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE_DIR=${STATEFEED_BASE_CACHE:-/var/cache/statefeed}
# Bump when the recipe above changes, so that a stale cached tarball is not reused.
BASE_RECIPE=2
HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

log() { printf '[container] %s\n' "$*" >&2; }

cmd_install() {
  local missing=()
  # The classic builder and `docker import` need only the engine and a client; Debian's
  # docker.io brings both (a client already on PATH is used first and works as well).
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  # A Compose implementation, for the test that runs deploy/compose.yaml: the docker
  # compose plugin where the client has it, else Debian's docker-compose.
  if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then
    missing+=(docker-compose)
  fi
  if [ ${#missing[@]} -eq 0 ]; then return; fi
  log "installing ${missing[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d keeps the package from starting a system-wide daemon: we start our own.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

engine_answers() {
  docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

cmd_start() {
  local dir=${1:?usage: container.sh start DIR}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  export DOCKER_HOST="unix://$dir/docker.sock"
  if [ -f "$dir/dockerd.pid" ] && kill -0 "$(cat "$dir/dockerd.pid")" 2>/dev/null \
      && engine_answers; then
    log "dockerd is already running in $dir"
  else
    log "starting dockerd in $dir"
    # setsid: the daemon outlives this script, in its own session, and is stopped by
    # `container.sh stop`.
    setsid dockerd \
      --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" \
      --host "$DOCKER_HOST" --iptables=false --ip-masq=false --bridge=none \
      >"$dir/dockerd.log" 2>&1 </dev/null &
    local waited=0
    until engine_answers; do
      if [ "$waited" -ge 120 ]; then  # tenths of a second: 12 s
        log "dockerd did not answer; its log:"
        tail -n 20 "$dir/dockerd.log" >&2
        exit 1
      fi
      sleep 0.1
      waited=$((waited + 1))
    done
    log "dockerd $(docker version --format '{{.Server.Version}}') answers on $DOCKER_HOST"
  fi
  echo "export DOCKER_HOST=$DOCKER_HOST"
}

cmd_stop() {
  local dir=${1:?usage: container.sh stop DIR}
  [ -d "$dir" ] || return 0
  export DOCKER_HOST="unix://$dir/docker.sock"
  if [ -f "$dir/dockerd.pid" ]; then
    local pid
    pid=$(cat "$dir/dockerd.pid")
    if engine_answers; then
      # Containers a failed test left behind; the engine stops them with it, but removing
      # them first keeps dockerd's own shutdown short.
      local left
      left=$(docker ps -aq)
      [ -z "$left" ] || docker rm -f $left >/dev/null 2>&1 || true
    fi
    if kill -0 "$pid" 2>/dev/null; then
      log "stopping dockerd (pid $pid)"
      kill -TERM "$pid"
      for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then
        log "dockerd did not stop in 15 s: killing it"
        kill -KILL "$pid" 2>/dev/null || true
      fi
    fi
  fi
  # Mounts under the data root (overlay layers, the containerd state) go before the files.
  { grep -o " $dir/[^ ]*" /proc/mounts || true; } | sort -r | while read -r mount; do
    umount -l "$mount" 2>/dev/null || true
  done
  rm -rf "$dir"
}

cmd_base() {
  if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "$BASE_IMAGE is in the engine"
    return
  fi
  local ca_sum tarball
  ca_sum=$(sha256sum "$HOST_CA_BUNDLE" | cut -c1-12)
  tarball="$CACHE_DIR/${BASE_SUITE}-minbase-r${BASE_RECIPE}-ca${ca_sum}.tar"
  if [ ! -s "$tarball" ]; then
    build_base_tarball "$tarball"
  fi
  log "importing $tarball as $BASE_IMAGE"
  docker import \
    --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --message "debootstrap --variant=minbase $BASE_SUITE, with $BASE_PACKAGES" \
    "$tarball" "$BASE_IMAGE" >/dev/null
}

# What the registry's debian images do to a debootstrap root (debuerreotype's minimizing
# config, and its slimify for the -slim variants), so that sizes measured on this base
# are what they are on the registry's image.
minimize() {
  local root=$1
  # No services start during `apt-get install` in a build.
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 0755 "$root/usr/sbin/policy-rc.d"
  printf 'force-unsafe-io\n' >"$root/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
  # slim: packages installed later leave out docs, manuals and translations too.
  {
    for path in '/usr/share/doc/*' '/usr/share/groff/*' '/usr/share/info/*' \
        '/usr/share/linda/*' '/usr/share/lintian/overrides/*' '/usr/share/locale/*' \
        '/usr/share/man/*'; do
      echo "path-exclude $path"
    done
    for path in '/usr/share/doc/*/copyright' /usr/share/locale/locale.alias; do
      echo "path-include $path"
    done
  } >"$root/etc/dpkg/dpkg.cfg.d/docker"
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias \
    -exec rm -rf {} +
  rm -rf "$root"/usr/share/groff/* "$root"/usr/share/info/* "$root"/usr/share/linda/* \
    "$root"/usr/share/lintian/overrides/* "$root"/usr/share/man/*
  # apt: remove downloaded packages after each install, keep lists compressed, skip the
  # translations.
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
  printf 'Acquire::GzipIndexes "true";\n' >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
  printf 'Acquire::Languages "none";\n' >"$root/etc/apt/apt.conf.d/docker-no-languages"
  printf 'Apt::AutoRemove::SuggestsImportant "false";\n' \
    >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/tmp/* \
    "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/var/cache/debconf/*-old
}

build_base_tarball() {
  local tarball=$1 root
  mkdir -p "$CACHE_DIR"
  root=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$root'" RETURN
  log "debootstrap --variant=minbase $BASE_SUITE (once per machine; about a minute)"
  local started=$SECONDS
  debootstrap --variant=minbase --include="$BASE_PACKAGES" \
    "$BASE_SUITE" "$root" "$BASE_MIRROR" >"$root.log" 2>&1 || {
      log "debootstrap failed; the end of its log:"; tail -n 20 "$root.log" >&2; exit 1; }
  rm -f "$root.log"
  # Trust what this machine trusts (a TLS-inspecting egress proxy's CA among them). Its
  # local CAs go where update-ca-certificates finds them, so that they stay in the
  # bundle if a build reinstalls ca-certificates.
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null 2>&1 || true
  fi
  cp "$HOST_CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
  # The registry's image reads the release, its updates and the security archive.
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $BASE_MIRROR
Suites: $BASE_SUITE $BASE_SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${BASE_MIRROR%/debian}/debian-security
Suites: $BASE_SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  minimize "$root"
  tar -C "$root" --numeric-owner -cf "$tarball.part" .
  # One base per machine: an older recipe's (or CA bundle's) goes.
  rm -f "$CACHE_DIR/${BASE_SUITE}"-minbase-*.tar
  mv "$tarball.part" "$tarball"
  log "base root file system cached as $tarball in $((SECONDS - started)) s"
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start "${2:-}" ;;
  stop) cmd_stop "${2:-}" ;;
  base) cmd_base ;;
  *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
