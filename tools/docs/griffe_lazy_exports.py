"""Griffe extension: show the names a package exports lazily as what they are, re-exports.

`deepspeed` and its plugin packages export their public names lazily (PEP 562 `__getattr__`
over a module-level table `{name: defining module}`, see `deepspeed.utils.lazy_exports`), so
that `import deepspeed` stays cheap. Griffe reads sources statically and would not see
`deepspeed.initialize` or `deepspeed.zero.Init`; this extension reads those tables and adds
each name as an alias of `<module>.<name>`, the same object a user gets at run time.

Used by mkdocs.yml (mkdocstrings' python handler `extensions`).
"""
import ast

import griffe

#: module-level tables of lazily exported names, as the packages spell them
EXPORT_TABLES = ("_LAZY", "_EXPORTS")


class LazyExports(griffe.Extension):
    def on_module_members(self, *, mod, **kwargs):
        for table in EXPORT_TABLES:
            attribute = mod.members.get(table)
            if attribute is None or attribute.value is None:
                continue
            exports = ast.literal_eval(str(attribute.value))
            for name, module in exports.items():
                if name not in mod.members:
                    mod.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=mod))
