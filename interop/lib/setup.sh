# shellcheck shell=bash
# `srp-verbs setup`: host packages, the kernel (from the shared tool's cache) and the guest
# images: base (busybox, iproute2's rdma, the kernel modules including ib_uverbs and rdma_ucm,
# the guest scripts) and the rdma-core overlay (libibverbs, librdmacm, the rxe provider and its
# driver file, ibv_devinfo and rping, with every library ldd lists) and the sg3_utils overlay
# (the SG_TOOLS binaries and libsgutils2, for `srp-verbs sg-checks`). Idempotent.

HOST_PKGS=(qemu-system-x86 busybox-static tcpdump tshark iproute2 cpio kmod gzip util-linux coreutils
           libibverbs1 librdmacm1 ibverbs-providers ibverbs-utils rdmacm-utils sg3-utils)
GUEST_MODS=(virtio_pci virtio_net crc32_generic rdma_rxe rdma_cm ib_uverbs rdma_ucm
            crct10dif_generic crc64_rocksoft_generic sd_mod scsi_transport_srp ib_srp)
RXE_PROVIDER=/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
RXE_DRIVER=/etc/libibverbs.d/rxe.driver
# Debian's sg3-utils (1.46) put into the sg-checks guest; sg_opcodes is sg3_utils' REPORT
# SUPPORTED OPERATION CODES / TASK MANAGEMENT FUNCTIONS tool (sg_rep_opcodes in the issue).
SG_TOOLS=(sg_inq sg_rtpg sg_vpd sg_modes sg_opcodes sg_logs sg_get_lba_status sg_turs sg_readcap sg_luns sg_dd)

setup_packages() {
    local missing=() p
    for p in "${HOST_PKGS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        echo "setup: host packages present"
        return 0
    fi
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -q
    timeout 1200 apt-get install -y -q --no-install-recommends "${missing[@]}"
}

kernel_ready() {
    [ -s "$KCACHE/KVER" ] || return 1
    local v; v=$(kver)
    [ -f "$KROOT/boot/vmlinuz-$v" ] && [ -f "$KROOT/lib/modules/$v/modules.dep" ]
}

setup_kernel() {
    if kernel_ready; then
        echo "setup: kernel $(kver) in $KROOT (shared cache, read only)"
        return 0
    fi
    [ -x "$SHARED_INTEROP/srp-interop" ] || die "no kernel in $KCACHE and no $SHARED_INTEROP/srp-interop to fetch it"
    echo "setup: fetching the kernel with $SHARED_INTEROP/srp-interop setup"
    "$SHARED_INTEROP/srp-interop" setup || die "srp-interop setup failed"
    kernel_ready || die "srp-interop setup left no kernel in $KCACHE"
}

# copy_with_libs BIN DESTROOT [DESTPATH]: a dynamically linked file plus what ldd lists.
copy_with_libs() {
    local bin=$1 root=$2 dest=${3:-$1} lib
    install -D -m 0755 "$(readlink -f "$bin")" "$root$dest"
    for lib in $(ldd "$bin" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib/{print $1}'); do
        [ -e "$root$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
    done
}

images_stamp() {
    {
        kver
        cat "$SRPV_DIR"/guest/* "$SRPV_DIR/lib/setup.sh"
        echo "${GUEST_MODS[*]}"
        ls -lL /bin/busybox /usr/bin/rdma "$RXE_PROVIDER" "$RXE_DRIVER" /usr/lib/x86_64-linux-gnu/libibverbs.so.1 \
            /usr/lib/x86_64-linux-gnu/librdmacm.so.1
        echo "${SG_TOOLS[*]}"
        (cd /usr/bin && ls -lL "${SG_TOOLS[@]}")
    } 2>/dev/null | sha256sum | cut -d' ' -f1
}

pack_cpio() {   # pack_cpio STAGEDIR OUTFILE
    (cd "$1" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$2.tmp"
    mv "$2.tmp" "$2"
}

build_images() {
    local v stamp moddir stage m line path rel
    v=$(kver); moddir="$KROOT/lib/modules/$v"
    stamp=$(images_stamp)
    if [ -f "$IMGDIR/base.cpio.gz" ] && [ -f "$IMGDIR/verbs.cpio.gz" ] && [ -f "$IMGDIR/sg.cpio.gz" ] \
        && [ "$(cat "$IMGDIR/stamp" 2>/dev/null)" = "$stamp" ]; then
        echo "setup: images up to date in $IMGDIR"
        return 0
    fi
    mkdir -p "$IMGDIR"
    stage="$IMGDIR/base"
    rm -rf "$stage"
    mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,etc/moddeps,proc,sys,dev,tmp,run,opt/srpd,lib/modules/"$v"}
    install -m 0755 /bin/busybox "$stage/bin/busybox"
    ln -s busybox "$stage/bin/sh"
    copy_with_libs /usr/bin/rdma "$stage"
    for m in "${GUEST_MODS[@]}"; do
        : > "$stage/etc/moddeps/$m"
        while read -r line; do
            case $line in
                insmod\ *) path=$(echo "$line" | awk '{print $2}') ;;
                builtin\ *) continue ;;
                *) echo "unexpected modprobe output: $line" >&2; return 1 ;;
            esac
            rel=${path#"$moddir/"}
            install -D -m 0644 "$path" "$stage/lib/modules/$v/$rel"
            grep -qxF "$rel" "$stage/etc/moddeps/$m" || echo "$rel" >> "$stage/etc/moddeps/$m"
        done < <(modprobe -d "$KROOT" -S "$v" --show-depends "$m")
    done
    cp "$moddir"/modules.{order,builtin,builtin.modinfo} "$stage/lib/modules/$v/"
    depmod -b "$stage" "$v"
    install -m 0755 "$SRPV_DIR/guest/init" "$stage/init"
    install -m 0644 "$SRPV_DIR"/guest/*.sh "$stage/etc/"
    install -m 0755 "$SRPV_DIR/guest/ctl" "$stage/bin/srpv-ctl"
    pack_cpio "$stage" "$IMGDIR/base.cpio.gz"
    echo "setup: base image $(du -h "$IMGDIR/base.cpio.gz" | cut -f1) ($(find "$stage" -name '*.ko' | wc -l) modules)"
    rm -rf "$stage"

    # rdma-core user space: the rxe provider is dlopen'ed by libibverbs after its .driver file.
    stage="$IMGDIR/verbs"
    rm -rf "$stage"; mkdir -p "$stage/etc/libibverbs.d"
    copy_with_libs /usr/lib/x86_64-linux-gnu/libibverbs.so.1 "$stage"
    copy_with_libs /usr/lib/x86_64-linux-gnu/librdmacm.so.1 "$stage"
    copy_with_libs "$RXE_PROVIDER" "$stage"
    install -m 0644 "$RXE_DRIVER" "$stage$RXE_DRIVER"
    for b in /usr/bin/ibv_devinfo /usr/bin/rping; do
        [ -x "$b" ] && copy_with_libs "$b" "$stage"
    done
    pack_cpio "$stage" "$IMGDIR/verbs.cpio.gz"
    echo "setup: rdma-core overlay $(du -h "$IMGDIR/verbs.cpio.gz" | cut -f1) ($(find "$stage" -type f | wc -l) files)"
    rm -rf "$stage"

    # sg3_utils, with libsgutils2 (what ldd lists), for the sg-checks guest.
    stage="$IMGDIR/sg"
    rm -rf "$stage"; mkdir -p "$stage"
    for b in "${SG_TOOLS[@]}"; do
        [ -x "/usr/bin/$b" ] || { echo "setup: /usr/bin/$b missing (sg3-utils not installed?)" >&2; return 1; }
        copy_with_libs "/usr/bin/$b" "$stage"
    done
    pack_cpio "$stage" "$IMGDIR/sg.cpio.gz"
    echo "setup: sg3_utils overlay $(du -h "$IMGDIR/sg.cpio.gz" | cut -f1) ($(find "$stage" -type f | wc -l) files, $(dpkg-query -W -f='sg3-utils ${Version}' sg3-utils 2>/dev/null))"
    rm -rf "$stage"
    echo "$stamp" > "$IMGDIR/stamp"
}

do_setup() {
    need_root
    mkdir -p "$CACHE" "$OUT" "$BINDIR"
    setup_packages
    setup_kernel
    build_images
}
