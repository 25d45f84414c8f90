"""The step and signal names a machine's source code uses, read without running it:
the steps its outcomes name (check E120) and the signals its Awaits wait for (the
`UnawaitedSignalWarning` of `gd.signal`).

`Next("charge")`, `Await(..., next="finish")` and `ScheduleChildren(next="finish")` name a
step of their own machine; one whose literal name the machine lacks fails the instance
when that line runs. `literal_step_names` finds them in a function's source: the module's
file is parsed once with `ast` (so a comment or a string at column 0 inside the function
does not matter), the function is the `def` (or lambda) its code object starts at, and
a call counts only when its name resolves, through the module's globals and the
function's closure, to gen_durable's outcome class itself.

Best effort and never raising: a function without source, wrapped by an object that
hides it, or made in a way `ast` cannot place yields nothing. Names built at run time
are not seen, and a function that reads its machine's `steps` (a generic handle() that
returns `Next("compensate")` only where such a step exists) is left alone.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache


def _outcomes() -> dict:
    """Outcome class → (index of its positional step argument, its keyword)."""
    from .outcomes import Await, Next, ScheduleChildren

    return {Next: (0, "step"), Await: (1, "next"), ScheduleChildren: (0, "next")}


@functools.lru_cache(maxsize=256)
def _module_tree(filename: str, lines: int):
    """The parsed module (None when it cannot be read or parsed); keyed by its number of
    lines too, so a file rewritten since is parsed again."""
    try:
        return ast.parse("".join(linecache.getlines(filename)), filename)
    except Exception:
        return None


def _first_line(node) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])


def function_node(func):
    """(filename, the function's ast node) or None when it cannot be found exactly once."""
    try:
        func = inspect.unwrap(func)
        code = func.__code__
        filename = code.co_filename
        tree = _module_tree(filename, len(linecache.getlines(filename)))
    except Exception:  # no code object, a __wrapped__ loop, an unreadable file
        return None
    if tree is None:
        return None
    kinds = (ast.Lambda,) if code.co_name == "<lambda>" else (ast.FunctionDef, ast.AsyncFunctionDef)
    found = [n for n in ast.walk(tree) if isinstance(n, kinds) and _first_line(n) == code.co_firstlineno
             and (kinds[0] is ast.Lambda or n.name == code.co_name)]
    return (filename, found[0]) if len(found) == 1 else None


def _bound_here(root) -> set:
    """The names `root` binds itself (parameters, assignments, imports, nested defs,
    `except ... as`): they shadow a global or closure name of the same spelling."""
    names = set()
    for n in ast.walk(root):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.alias):
            names.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not root:
            names.add(n.name)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


def _resolve(node, namespace: dict, local: set):
    """The object a call's `Name` or `module.Name` refers to; None for a local name."""
    try:  # an attribute lookup runs the object's own code: whatever it raises means "not ours"
        if isinstance(node, ast.Name) and node.id not in local:
            return namespace.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id not in local:
            return getattr(namespace.get(node.value.id), node.attr, None)
    except Exception:
        pass
    return None


def _reads_steps(root) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "steps" for n in ast.walk(root))


def _outcome_calls(func):
    """(filename, root, [(outcome class, call node)]) of the calls in `func` that resolve
    to one of gen_durable's outcome classes; None when the function cannot be placed."""
    placed = function_node(func)
    if placed is None:
        return None
    filename, root = placed
    func = inspect.unwrap(func)
    namespace = dict(func.__globals__)
    try:
        namespace.update(inspect.getclosurevars(func).nonlocals)
    except Exception:
        pass
    known, local = _outcomes(), _bound_here(root)
    calls = []
    for node in ast.walk(root):
        if isinstance(node, ast.Call):
            target = _resolve(node.func, namespace, local)
            outcome = next((k for k in known if k is target), None)  # identity: no __eq__ of theirs
            if outcome is not None:
                calls.append((outcome, node))
    return filename, root, calls


def _argument(node, index: int, keyword: str):
    return next((k.value for k in node.keywords if k.arg == keyword),
                node.args[index] if len(node.args) > index else None)


def literal_step_names(func) -> list[tuple[str, str, str, int]]:
    """[(outcome class name, step name, filename, line)] of the outcomes in `func` that
    name a step by a string literal. Never raises (see the module docstring)."""
    try:
        found = _outcome_calls(func)
        if found is None or _reads_steps(found[1]):
            return []
        filename, _root, calls = found
        known, named = _outcomes(), []
        for outcome, node in calls:
            arg = _argument(node, *known[outcome])
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                named.append((outcome.__name__, arg.value, filename, node.lineno))
        return named
    except Exception:
        return []


def _literal_names(arg):
    """The names of an Await's `names` argument when it is a str literal or a list, tuple
    or set of them; None otherwise (built at run time)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, (ast.List, ast.Tuple, ast.Set)) and arg.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in arg.elts):
        return {e.value for e in arg.elts}
    return None


def step_functions(cls) -> list[tuple[str, object]]:
    """[(attribute name, function)] of machine `cls`'s step methods and its own handle()
    (when it overrides Machine's), as defined — a staticmethod or classmethod unwrapped;
    the function is None where the attribute cannot be read statically."""
    from .machine import Machine

    attrs = dict.fromkeys(cls.steps.values())
    if getattr(cls, "handle", None) is not getattr(Machine, "handle", None):
        attrs["handle"] = None
    found = []
    for attr in attrs:
        func = inspect.getattr_static(cls, attr, None)
        found.append((attr, func.__func__ if isinstance(func, (staticmethod, classmethod)) else func))
    return found


@functools.lru_cache(maxsize=256)
def awaited_signal_names(cls) -> frozenset | None:
    """The signal names machine `cls`'s steps (and its own handle()) can await, read from
    their source: every `Await(...)` in them names its signals by literals. None when that
    cannot be known: a step whose source cannot be placed, an Await whose names are built
    at run time, a step that reads `ctx.all` (the whole inbox, any name), or no Await in
    the steps at all (it may await through a helper elsewhere). Never raises."""
    from .outcomes import Await

    try:
        names, awaits = set(), 0
        for _attr, func in step_functions(cls):
            found = _outcome_calls(func) if callable(func) else None
            if found is None:
                return None
            _filename, root, calls = found
            if any(isinstance(n, ast.Attribute) and n.attr == "all" for n in ast.walk(root)):
                return None
            for outcome, node in calls:
                if outcome is not Await:
                    continue
                literal = _literal_names(_argument(node, 0, "names"))
                if literal is None:
                    return None
                names |= literal
                awaits += 1
        return frozenset(names) if awaits else None
    except Exception:
        return None
