#!/usr/bin/env bash
# Which of Gluon's shared-memory gather, scatter and atomic scatter operations this Triton has,
# and Gluon's exported names; packs Triton's gluon package as $OUT/gluon36.tgz to read.
#
#   OUT=<dir> bash benchmark/research/gluon_api.sh
python3 - <<'PY'
import triton, inspect
print("triton", triton.__version__)
from triton.experimental.gluon.language import _core as c
for name in ["gather","scatter","atomic_scatter_add","atomic_scatter_max"]:
    print(name, hasattr(c.shared_memory_descriptor, name))
import triton.experimental.gluon.language as gl
print("histogram sig", inspect.signature(gl.histogram) if hasattr(gl,"histogram") else None)
print([n for n in dir(gl) if not n.startswith("_")])
PY
tar czf $OUT/gluon36.tgz -C $(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))") experimental/gluon language/standard.py 2>/dev/null; ls -la $OUT
