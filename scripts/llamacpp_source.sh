# Sourced by scripts/llamacpp_anchor.sh and scripts/llamacpp_server.sh: the llama.cpp source vendored in
# the llama-cpp-python sdist, unpacked under $1 (version $2), once.
#
# The sdist is fetched by its link on PyPI's simple index and checked against the sha256 the index gives.
# `pip download --no-binary :all:` did this before, but it also builds the sdist's build backends from
# source to read its metadata (scikit-build-core, hatchling, pathspec, flit-core ...), which took minutes
# and failed on one flaky download (2026-12-07); nothing of that is needed to read the C++ source.
llamacpp_source() {
    local root=$1 version=$2 python=${PYTHON:-python3}
    local src=$root/llama_cpp_python-$version/vendor/llama.cpp
    [ -d "$src" ] && return 0
    mkdir -p "$root"
    echo "downloading the llama-cpp-python $version sdist into $root" >&2
    "$python" - "$root" "$version" <<'PY'
import hashlib, html.parser, sys, tarfile, urllib.request
root, version = sys.argv[1], sys.argv[2]
name = f"llama_cpp_python-{version}.tar.gz"
index = "https://pypi.org/simple/llama-cpp-python/"

class Links(html.parser.HTMLParser):
    found: list[str] = []
    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href") or ""
        if tag == "a" and href.split("#")[0].endswith("/" + name):
            self.found.append(href)

links = Links()
links.feed(urllib.request.urlopen(index, timeout=60).read().decode())
if not links.found:
    sys.exit(f"{name} is not on {index}")
url, _, digest = links.found[0].partition("#sha256=")
data = urllib.request.urlopen(url, timeout=600).read()
if digest and hashlib.sha256(data).hexdigest() != digest:
    sys.exit(f"{name}: sha256 differs from the index's")
path = f"{root}/{name}"
open(path, "wb").write(data)
with tarfile.open(path) as archive:
    archive.extractall(root, filter="data")
PY
}
