"""What the fixture plugins of these tests import of deepspeed: they are written from
``deepspeed.hooks`` alone, the proof that the hook file is the whole contract."""
import ast


def deepspeed_imports(path):
    """The ``deepspeed`` modules the Python file at ``path`` imports."""
    tree = ast.parse(path.read_text())
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    modules |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for a in node.names}
    return {m for m in modules if m and m.startswith("deepspeed")}
