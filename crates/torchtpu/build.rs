//! Compiles the C++ shim (csrc/) against the installed torch and links it into the extension.
//! The torch version it was built for is baked in: torchtpu refuses to load into another one
//! (DispatchKey numbers and C++ symbols differ between torch releases).
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

const INSTALL_HINT: &str = "torchtpu builds against the torch installed in the environment it is \
installed into. Install a supported torch first (pip install 'torch>=2.11,<2.16'), then build \
without build isolation: pip install --no-build-isolation .   (or: maturin develop --release)";

fn main() {
    let python = std::env::var("PYO3_PYTHON")
        .or_else(|_| std::env::var("PYTHON_SYS_EXECUTABLE"))
        .unwrap_or_else(|_| "python3".to_string());
    let out = Command::new(&python)
        // An installed torchtpu built for another torch must not load while we ask.
        .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        .args(["-c", "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)"])
        .output()
        .unwrap_or_else(|e| panic!("torchtpu: cannot run {python} to find torch: {e}"));
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("");
        panic!("\n\ntorchtpu needs torch installed to build ({python}: {last}).\n{INSTALL_HINT}\n\n");
    }
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let torch_dir = PathBuf::from(lines.next().unwrap().trim());
    let version = lines.next().unwrap_or("").trim().to_string();
    check_supported(&version);
    println!("cargo:rustc-env=TORCHTPU_BUILT_WITH_TORCH={version}");

    let csrc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../csrc");
    // Every file of the shim: its parts (*.cpp) are compiled, the headers rebuild them. The
    // folder itself reruns this script when a file is added or removed.
    let mut files: Vec<PathBuf> = std::fs::read_dir(&csrc)
        .unwrap_or_else(|e| panic!("torchtpu: cannot read {}: {e}", csrc.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    println!("cargo:rerun-if-changed={}", csrc.display());
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    write_abi_layout(&out_dir.join("abi_layout.h"));
    // A reinstalled torch of another version must rebuild the shim.
    println!("cargo:rerun-if-changed={}", torch_dir.join("version.py").display());
    // One translation unit that includes every part: torch's headers are most of a part's
    // compile time, so parsing them once builds the shim in ~40 s instead of ~4 minutes.
    let mut unity = String::new();
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "cpp")) {
        writeln!(unity, "#include \"{}\"", f.canonicalize().unwrap().display()).unwrap();
    }
    let unity_file = out_dir.join("shim_all.cpp");
    std::fs::write(&unity_file, unity).unwrap();
    cc::Build::new()
        .cpp(true)
        // torch 2.14's headers require C++20; older ones build with it too.
        .std("c++20")
        .file(&unity_file)
        .include(&csrc)
        .include(&out_dir)
        .include(torch_dir.join("include"))
        .include(torch_dir.join("include/torch/csrc/api/include"))
        // kineto's headers (csrc/profiler.cpp): torch ships them beside its own.
        .include(torch_dir.join("include/kineto"))
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .flag("-fvisibility=hidden")
        .flag("-w")
        .opt_level(2)
        .link_lib_modifier("+whole-archive")
        .compile("torchtpu_shim");
    let lib = torch_dir.join("lib");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    // Resolve torch's libraries from the torch package next to ours in site-packages.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN/../torch/lib");
}

/// The supported range is torch 2.11 to 2.15 (python/torchtpu/_version_check.py says the same).
fn check_supported(version: &str) {
    let mut parts = version.split(|c: char| c == '.' || c == '+');
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    if (major, minor) < (2, 11) || (major, minor) > (2, 15) {
        panic!("\n\ntorchtpu supports torch 2.11 to 2.15; the installed torch is {version}.\n{INSTALL_HINT}\n\n");
    }
}

/// Writes the Rust side of the C ABI (crates/abi) as C macros for csrc/abi_check.cpp, which
/// checks at compile time that csrc/abi.h lays out every struct, field and constant the same
/// way: each struct's size, alignment and field count, each field's offset and size, each value.
fn write_abi_layout(path: &Path) {
    use abi::*;
    use std::mem::{align_of, offset_of, size_of, size_of_val, zeroed};
    let (mut structs, mut fields, mut constants) = (String::new(), String::new(), String::new());
    // abi is a build dependency, built for this machine: its layout is the target's only when
    // the two are the same machine (a cross build skips the check).
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    if !native {
        println!("cargo:warning=torchtpu: cross build: the C/Rust ABI layout check is skipped");
    }
    // A struct and its fields. The pattern names every Rust field: one added to crates/abi but
    // not here fails this build script; abi_check.cpp compares the count with the C struct's.
    macro_rules! layout {
        ($s:ident { $($f:ident),* } $(+ union $u:ident)?) => {{
            let _names_every_field = |v: $s| {
                let $s { $($f: _,)* $($u: _)? } = v; // list every field of the crates/abi struct
            };
            let count = [$(stringify!($f),)* $(stringify!($u))?].len();
            let (size, align) = (size_of::<$s>(), align_of::<$s>());
            writeln!(structs, "  X({}, {size}, {align}, {count}) \\", stringify!($s)).unwrap();
            let v: $s = unsafe { zeroed() };
            $(writeln!(fields, "  X({}, {}, {}, {}) \\", stringify!($s), stringify!($f),
                       offset_of!($s, $f), size_of_val(&v.$f)).unwrap();)*
        }};
    }
    // A member of TtArg's payload: the union field `p` in Rust, an anonymous union in C (so
    // its members are named as TtArg's own there).
    macro_rules! payload {
        ($($c:literal = $($f:ident).+),*) => {{
            let v: TtArg = unsafe { zeroed() };
            $(writeln!(fields, "  X(TtArg, {}, {}, {}) \\", $c, offset_of!(TtArg, $($f).+),
                       size_of_val(unsafe { &v.$($f).+ })).unwrap();)*
        }};
    }
    macro_rules! constants {
        ($($c:ident),*) => { $(writeln!(constants, "  X({}, {}) \\", stringify!($c), $c).unwrap();)* };
    }
    if native {
        layout!(TtTensor { cell, host, sizes, strides, offset, ndim, dtype, flags });
        layout!(TtArg { kind } + union p);
        payload!("t" = p.t, "n.i" = p.n.i, "n.i2" = p.n.i2, "f" = p.f, "c.re" = p.c.re, "c.im" = p.c.im,
                 "list.ptr" = p.list.ptr, "list.len" = p.list.len);
        layout!(TtOut { kind, dtype, ndim, sizes, cell, i });
        layout!(TtResult { status, resize_arg, message, nouts, outs });
        layout!(TtStat { current, peak, allocated, freed });
        layout!(TtMemoryStats { buffers, bytes, reserved });
        constants!(TT_NONE, TT_TENSOR, TT_INT, TT_FLOAT, TT_BOOL, TT_COMPLEX, TT_INT_LIST, TT_FLOAT_LIST,
                   TT_BOOL_LIST, TT_TENSOR_LIST, TT_STR, TT_SCALAR_TYPE, TT_GENERATOR, TT_OTHER);
        constants!(TT_HOST, TT_WRAPPED_NUMBER, TT_OUT_TENSOR, TT_OUT_LIST, TT_OUT_UNDEFINED);
        constants!(TT_OK, TT_ERR_RUNTIME, TT_ERR_VALUE, TT_ERR_TYPE, TT_ERR_INDEX, TT_ERR_NOT_IMPLEMENTED,
                   TT_RESIZE, TT_ERR_NO_LOWERING, TT_ERR_OUT_OF_MEMORY);
    }
    let text = format!(
        "// Generated by crates/torchtpu/build.rs: the layout of crates/abi, the Rust mirror of abi.h.\n\
         #define TT_RUST_STRUCTS(X) \\\n{structs}\n\
         #define TT_RUST_FIELDS(X) \\\n{fields}\n\
         #define TT_RUST_CONSTANTS(X) \\\n{constants}\n"
    );
    std::fs::write(path, text).unwrap_or_else(|e| panic!("torchtpu: cannot write {}: {e}", path.display()));
}
