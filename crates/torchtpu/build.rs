//! Compiles the C++ shim (csrc/) against the installed torch and links it into the extension.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let python = std::env::var("PYO3_PYTHON")
        .or_else(|_| std::env::var("PYTHON_SYS_EXECUTABLE"))
        .unwrap_or_else(|_| "python3".to_string());
    let out = Command::new(&python)
        .args(["-c", "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)"])
        .output()
        .expect("run python to find torch");
    assert!(out.status.success(), "torchtpu needs torch installed to build: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let torch_dir = PathBuf::from(lines.next().unwrap().trim());
    let version = lines.next().unwrap_or("").trim().to_string();
    println!("cargo:rustc-env=TORCHTPU_BUILT_WITH_TORCH={version}");

    let csrc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../csrc");
    for f in ["shim.cpp", "abi.h"] {
        println!("cargo:rerun-if-changed={}", csrc.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file(csrc.join("shim.cpp"))
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
