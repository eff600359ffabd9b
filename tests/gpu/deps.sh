# Sourced by tests/gpu_check.sh and tests/gpu/trial.sh. DEPS=DIR: the build's libraries and headers unpacked under
# DIR/usr (a machine without them installed): dep_inc and dep_ldflags are the flags that find them, and the
# programs built find them at run time. Without DEPS both are empty.
dep_inc="" dep_ldflags=""
if [ -n "${DEPS:-}" ]; then
    dep_lib="$DEPS/usr/lib/x86_64-linux-gnu"
    dep_inc="-I$DEPS/usr/include"
    dep_ldflags="-L$dep_lib -Wl,-rpath,$dep_lib"
    export LD_LIBRARY_PATH="$dep_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
