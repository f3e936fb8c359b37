"""Hard-links the files of one virtual environment that are byte-identical to the same file of
another (the same torch, CUDA libraries and Triton wheels installed in both), so that the
serving environments beside .venv cost disk only for what differs. pip replaces a file rather
than writing into it, so an upgrade in either environment later unlinks just that file.

    python scripts/share_venv_files.py .venv .venv-serve     # .venv-serve's copies become links
"""
import filecmp
import os
import sys
import sysconfig


def site_packages(venv):
    path = sysconfig.get_path("purelib", vars={"base": venv, "platbase": venv})
    if not os.path.isdir(path):
        raise SystemExit(f"{venv}: no site-packages at {path}")
    return path


def share(reference, other, min_size=1 << 16):
    """Links other's files to reference's where path and content are equal; returns bytes saved."""
    ref_root, root = site_packages(reference), site_packages(other)
    saved = 0
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            twin = os.path.join(ref_root, os.path.relpath(path, root))
            if os.path.islink(path) or not os.path.isfile(twin) or os.path.islink(twin):
                continue
            st, twin_st = os.stat(path), os.stat(twin)
            if st.st_size < min_size or st.st_size != twin_st.st_size or st.st_ino == twin_st.st_ino:
                continue
            if st.st_mode != twin_st.st_mode or not filecmp.cmp(path, twin, shallow=False):
                continue
            tmp = path + ".share-tmp"
            os.link(twin, tmp)
            os.replace(tmp, path)
            saved += st.st_size
    return saved


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    for venv in sys.argv[2:]:
        print(f"{venv}: {share(sys.argv[1], venv) / 2**30:.1f} GiB now shared with {sys.argv[1]}")
