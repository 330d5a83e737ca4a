"""The code in a model's answer, read as EvalPlus's sanitizer reads it (evalplus/evalplus, evalplus/sanitize.py,
the step Qwen's own HumanEval run applies: QwenLM/Qwen2.5-Coder, qwencoder-eval/instruct/eval_plus/test.sh).

    sanitize(code, entry_point=None) -> str

1. The longest run of lines that parses (counted in non-blank lines, at least two lines; the first such run
   on ties): prose, a broken demo at the end or a cut-off line no longer sinks a correct function.
2. Of that run's top-level statements: every import; each class; each function that returns something (a
   `return` anywhere in it); each assignment to a plain name; a name's first definition only.
3. With an entry point, only the definitions it reaches (every identifier in a definition is an edge,
   followed transitively). A demo `print(...)`, a loop, an `if __name__ == "__main__":` block never survive.
4. Nothing survives: the run of step 1 as it is.

EvalPlus does this with tree-sitter; here Python's own parser (ast, as EvalPlus's syntax check) finds the same
statements, and the identifiers are the tokenizer's names that are not keywords (tree-sitter's `identifier`
nodes). Two of EvalPlus's rules are kept on purpose, so scores compare: a decorated definition is not a
definition (tree-sitter calls it `decorated_definition`), and a function without `return` is dropped.
evalplus itself is not a dependency: importing its sanitizer pulls in `datasets`, `openai`, `anthropic`,
tree-sitter and more.
"""

from __future__ import annotations

import ast
import io
import keyword
import tokenize

MIN_SPAN = 2  # EvalPlus's search starts each run's end one line after its start


def sanitize(code: str, entry_point: str | None = None) -> str:
    """The program EvalPlus would score for this answer (see the module's docstring)."""
    span = longest_parsing_span(code)
    kept = _definitions(span, entry_point).strip()
    return kept if kept else span


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, MemoryError, ValueError, RecursionError):  # ValueError: a NUL byte
        return False
    return True


def longest_parsing_span(code: str) -> str:
    """lines[i..j] (j >= i + 1) that parse with the most non-blank lines; the first such on ties, ending at its
    last non-blank line; the first line when no run parses. EvalPlus tries every (i, j); the same answer comes
    from trying each start's ends longest first and stopping as soon as no longer run can win."""
    lines = code.split("\n")
    filled = [1 if line.strip() else 0 for line in lines]
    after = [0] * (len(lines) + 1)  # after[i]: non-blank lines from i to the end
    for i in range(len(lines) - 1, -1, -1):
        after[i] = after[i + 1] + filled[i]
    best, best_pair = 0, (0, 0)
    for i in range(len(lines)):
        if after[i] <= best:
            break  # no later start has enough lines left to win
        for j in range(len(lines) - 1, i + MIN_SPAN - 2, -1):
            count = after[i] - after[j + 1]
            if count <= best:
                break
            if parses("\n".join(lines[i:j + 1])):
                best, best_pair = count, (i, _first_end(lines, filled, i, j))
                break
    i, j = best_pair
    return "\n".join(lines[i:j + 1])


def _first_end(lines: list[str], filled: list[int], i: int, j: int) -> int:
    """The smallest end with the same non-blank lines as lines[i..j] that still parses (EvalPlus keeps the first
    (i, j) reaching a count, so a run never ends in blank lines it could leave out)."""
    end = j
    while end - 1 >= i + MIN_SPAN - 1 and not filled[end]:
        end -= 1
    for k in range(end, j + 1):  # blank lines only between end and j: all but a multi-line string parse
        if parses("\n".join(lines[i:k + 1])):
            return k
    return j


def _definitions(code: str, entry_point: str | None) -> str:
    try:
        tree = ast.parse(code)
    except (SyntaxError, MemoryError, ValueError, RecursionError):
        return ""
    imports: list[str] = []
    definitions: list[tuple[str | None, str]] = []
    seen: set[str | None] = set()
    lines = code.split("\n")
    for node in tree.body:
        text = ast.get_source_segment(code, node) or ""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            text = _with_trailing_comments(lines, node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(text)
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.decorator_list:
                continue  # tree-sitter's decorated_definition: not a definition to EvalPlus
            name = node.name
            if not isinstance(node, ast.ClassDef) and not _returns(node):
                continue
        elif isinstance(node, ast.Assign):
            name = _plain_name(node.targets[0])
        elif isinstance(node, ast.AnnAssign):
            name = _plain_name(node.target)
        else:
            continue
        if name in seen:
            continue
        seen.add(name)
        definitions.append((name, text))
    if entry_point:
        reached = _reached(entry_point, {name: _identifiers(text) for name, text in definitions})
        definitions = [(name, text) for name, text in definitions if name in reached]
    return "\n".join(imports + [text for _, text in definitions])


def _with_trailing_comments(lines: list[str], node: ast.AST) -> str:
    """A definition's lines as tree-sitter's node holds them: through a comment after its last statement and
    the indented comment lines that close its body (a comment is no statement to ast)."""
    end = node.end_lineno
    for k in range(end, len(lines)):  # lines[k] is line k + 1
        stripped = lines[k].strip()
        if stripped.startswith("#") and lines[k][:1] in (" ", "\t"):
            end = k + 1
        elif stripped:
            break
    last = lines[node.end_lineno - 1]
    tail = last[node.end_col_offset:] if end == node.end_lineno else ""
    head = lines[node.lineno - 1:node.end_lineno - 1] + [last[:node.end_col_offset]]
    if tail.strip().startswith("#") or end > node.end_lineno:
        head[-1] = last
    return "\n".join(head + lines[node.end_lineno:end])


def _returns(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Return) for n in ast.walk(node))


def _plain_name(target: ast.AST) -> str | None:
    """The assigned name; None for a tuple, attribute or subscript target (tree-sitter finds no identifier)."""
    return target.id if isinstance(target, ast.Name) else None


def _identifiers(text: str) -> set[str]:
    out = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
                out.add(tok.string)
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


def _reached(entry_point: str, edges: dict) -> set:
    """The names reached from entry_point along the edges (breadth first), the entry point included."""
    queue, seen = [entry_point], {entry_point}
    while queue:
        for name in edges.get(queue.pop(0), ()):
            if name not in seen:
                seen.add(name)
                queue.append(name)
    return seen
