"""A test waits for an event, not for a fixed time: no `time.sleep` of more than MAX_SLEEP_S in the
tests or the helpers they call (a poll loop's step is at most that; a wait is a poll with a
deadline: thread_children.wait_for). Read from the source with `ast`: a sleep whose argument is a
number, a module-level constant, or arithmetic of those.

Programs the tests start as workloads or stand-ins (a module with `if __name__ == "__main__":`)
and code in strings (a child's script) sleep as the workload they play, and are not read."""

from __future__ import annotations

import ast
import glob
import operator
import os
from typing import Dict, Iterator, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_SLEEP_S = 0.2
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _value(node: ast.AST, constants: Dict[str, float]) -> Optional[float]:
    """The number an expression stands for, where the source alone says; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _value(node.operand, constants)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _value(node.left, constants), _value(node.right, constants)
        if left is None or right is None or (isinstance(node.op, ast.Div) and right == 0):
            return None
        return _ARITHMETIC[type(node.op)](left, right)
    return None


def _is_program(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)]
            strings = [n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant)]
            if "__name__" in names and "__main__" in strings:
                return True
    return False


def _sleep_names(tree: ast.Module) -> Tuple[set, set]:
    """(names the time module goes by, names time.sleep itself goes by) in a module."""
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name == "time")
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            functions.update(a.asname or a.name for a in node.names if a.name == "sleep")
    return modules, functions


def long_sleeps(source: str, path: str = "<test>") -> Iterator[Tuple[int, float]]:
    """(line, seconds) of each sleep over MAX_SLEEP_S in a module's source."""
    tree = ast.parse(source, path)
    if _is_program(tree):
        return
    constants: Dict[str, float] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _value(node.value, constants)
            if value is not None:
                constants[node.targets[0].id] = value
    modules, functions = _sleep_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        is_sleep = ((isinstance(func, ast.Attribute) and func.attr == "sleep" and isinstance(func.value, ast.Name)
                     and func.value.id in modules) or (isinstance(func, ast.Name) and func.id in functions))
        if is_sleep:
            seconds = _value(node.args[0], constants)
            if seconds is not None and seconds > MAX_SLEEP_S:
                yield node.lineno, seconds


def test_no_test_or_helper_sleeps_longer_than_a_poll_step():
    paths = sorted(glob.glob(os.path.join(HERE, "**", "*.py"), recursive=True))
    assert os.path.join(HERE, "thread_children.py") in paths and os.path.join(HERE, "e2e", "guest_helper.py") in paths
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        found += [f"{os.path.relpath(path, HERE)}:{line}: sleep({seconds:g})" for line, seconds in long_sleeps(source, path)]
    assert found == [], (f"fixed sleeps over {MAX_SLEEP_S} s: wait for the event instead (a poll with a deadline, "
                         f"thread_children.wait_for): {found}")


def test_the_sleep_check_sees_each_spelling():
    source = '''
import time
import time as clock
from time import sleep
from time import sleep as nap
SETTLE_S = 0.5
HALF = SETTLE_S / 2
def test_x():
    time.sleep(0.7)
    clock.sleep(1)
    sleep(SETTLE_S)
    nap(HALF + 0.01)
    time.sleep(0.2)
    time.sleep(0.05)
    time.sleep(delay)
    other.sleep(5)
    child = "import time; time.sleep(60)"
'''
    assert [line for line, _ in long_sleeps(source)] == [9, 10, 11, 12]
    program = "import time\ndef main():\n    time.sleep(3600)\nif __name__ == '__main__':\n    main()\n"
    assert list(long_sleeps(program)) == []
