#!/bin/bash
# A kit for the GPU machine, small enough to travel (the device tool carries at most 64 MiB of the working tree):
# the tool, the shared library and the test programs of a -DGEMMA4C_CUDA=ON build, the libraries they load that a
# bare CUDA image lacks, and the parts of ../shared the GPU steps read. Each static test program carries the whole
# CUDA fat binary (17 MB), so the kit holds libgemma4c.a and the tests' objects once, and `unpack` links them there.
#
# usage (here):  bench/cuda_kit.sh make BUILD SHARED KIT.tar.xz   e.g. build-cuda ../shared .wt-gpu/kit.tar.xz
#        (G4_KIT_FIXTURES="dense-ple dense-keqv moe" leaves the towers' fixtures out: a smaller kit)
#        (there): bench/cuda_kit.sh unpack KIT.tar.xz DIR          -> DIR/bin (gemma4c, tests, and g4-batch-bench
#                 where the build has it: bench/batch_speed.sh with G4_BATCH_BENCH=DIR/bin/g4-batch-bench), DIR/lib,
#                 DIR/shared
#                 then bench/cuda_gpu.sh DIR/bin DIR/shared OUT ... with LD_LIBRARY_PATH=DIR/lib
set -eu
TESTS="test_backend_ops test_decoder test_vision test_audio test_unified test_server_engine test_scheduler"
case ${1:-} in
make)
    B=$2 SH=$3 KIT=$4
    t=$(mktemp -d)
    mkdir -p "$t/bin" "$t/lib" "$t/obj" "$t/shared/fixtures"
    cp "$B/gemma4c" "$t/bin/"
    cp -a "$B"/libgemma4c.so* "$B/libgemma4c.a" "$B/libgemma4c-server.a" "$t/lib/"
    for x in $TESTS; do cp "$B/tests/CMakeFiles/$x.dir/$x.c.o" "$t/obj/"; done
    bb=$B/CMakeFiles/g4-batch-bench.dir/bench/batch_bench.c.o # (where built: bench/batch_speed.sh's measurer)
    if [ -f "$bb" ]; then cp "$bb" "$t/obj/g4-batch-bench.c.o"; fi
    # what the tool and the tests load beyond the C/C++ runtime and CUDA (the image has those)
    for f in $(ldd "$B/gemma4c" "$B/libgemma4c.so.0" "$B/tests/test_server_engine" | awk '/=>/ {print $3}' | sort -u); do
        case $(basename "$f") in
        libc.so* | libm.so* | libstdc++* | libgcc_s* | libpthread* | libdl.so* | librt.so* | libcublas* | libgemma4c*) ;;
        *) cp -L "$f" "$t/lib/" ;;
        esac
    done
    cp -r "$SH/configs" "$SH/reference" "$t/shared/"
    for f in ${G4_KIT_FIXTURES:-dense-ple dense-keqv moe vision audio unified} README.md; do
        cp -r "$SH/fixtures/$f" "$t/shared/fixtures/"
    done
    tar -C "$t" -cf - bin lib obj shared | xz -T0 -9 >"$KIT" # (-9: a 64 MB window, where the .a and .so share their device code: 2/3 of -6's size)
    rm -rf "$t"
    ls -la "$KIT"
    ;;
unpack)
    KIT=$2 D=$3
    mkdir -p "$D"
    xz -dc "$KIT" | tar -C "$D" -xf -
    cu=$(dirname "$(find /usr/local/cuda*/ -name libcudart_static.a 2>/dev/null | head -1)")
    [ -n "$cu" ] || { echo "no libcudart_static.a on this machine"; exit 1; }
    so() { for n in "$@"; do ls "$D"/lib/lib$n.so.* | head -1; done; }
    media=$(so jpeg spng webpdemux webp gif exif sndfile soxr fftw3 jansson)
    for x in $TESTS $(cd "$D/obj" && ls g4-batch-bench.c.o 2>/dev/null | sed 's/[.]c[.]o$//'); do
        extra=
        [ "$x" = test_server_engine ] && extra="$D/lib/libgemma4c-server.a $D/lib/libgemma4c.a $(so microhttpd curl)"
        # shellcheck disable=SC2086 # (lists of paths)
        g++ "$D/obj/$x.c.o" -o "$D/bin/$x" "$D/lib/libgemma4c.a" $extra $media "$cu/libcudart_static.a" \
            "$cu/libcublas.so" "$cu/libcublasLt.so" "$cu/libculibos.a" -lm -ldl -lrt -lpthread \
            -Wl,-rpath-link,"$D/lib" || { echo "linking $x failed"; exit 1; }
    done
    echo "kit in $D: $(ls "$D/bin" | tr '\n' ' ')"
    ;;
*)
    echo "usage: $0 make BUILD SHARED KIT.tar.xz | unpack KIT.tar.xz DIR" >&2
    exit 2
    ;;
esac
