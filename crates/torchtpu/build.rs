//! Compiles the C++ shim (csrc/) against the installed torch and links it into the extension.
//! The torch version it was built for is baked in: torchtpu refuses to load into another one
//! (DispatchKey numbers and C++ symbols differ between torch releases).
use std::path::PathBuf;
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
    // A reinstalled torch of another version must rebuild the shim.
    println!("cargo:rerun-if-changed={}", torch_dir.join("version.py").display());
    cc::Build::new()
        .cpp(true)
        // torch 2.14's headers require C++20; older ones build with it too.
        .std("c++20")
        .files(files.iter().filter(|f| f.extension().is_some_and(|e| e == "cpp")))
        .include(&csrc)
        .include(torch_dir.join("include"))
        .include(torch_dir.join("include/torch/csrc/api/include"))
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
