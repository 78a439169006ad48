"""Requests for the target to answer, so the speculator can learn from the target's own text.

Wertheimer et al. train their speculators in two stages, the second on text the base
model generated itself: at run time the head always reads the target's hidden states
along the target's *own* continuations, which are far more predictable than human
text.  specviz does the same, offline, with requests built from what is installed:

- functions: for each documented public function in a site-packages file, "Write a
  Python function `name(args)` that <first sentence of its docstring>" (files split
  into training and held-out sets by the same path hash as the source windows);
- SQL: query intents over a small bank of made-up schemas;
- algorithms: classic exercises in a few styles.

The app's evaluation prompts (assets/prompts.jsonl) must not leak in: `leaks`
rejects any request naming one of their functions or their schema, and a test checks
the whole bank against the file.
"""

from __future__ import annotations

import ast
import hashlib
import io
import random
import re
import tokenize
from pathlib import Path
from typing import Iterator

# Names and schema words of the evaluation prompts; a request containing one is dropped.
EVAL_WORDS = ("fibonacci", "binary_search", "binary search", "customers", "hash table", "french")

SCHEMAS = [
    ("employees(id, name, department_id, salary, hired_on)", "departments(id, name)", "employee", "salary"),
    ("products(id, name, category_id, price)", "categories(id, title)", "product", "price"),
    ("students(id, name, year)", "enrollments(student_id, course_id, grade)", "student", "grade"),
    ("books(id, title, author_id, published)", "loans(id, book_id, member_id, loaned_on)", "book", "loan count"),
    ("flights(id, origin, destination, departs_at, seats)", "bookings(id, flight_id, passenger, paid)", "flight",
     "revenue"),
    ("songs(id, title, artist_id, seconds)", "plays(id, song_id, user_id, played_at)", "song", "play count"),
    ("patients(id, name, born)", "visits(id, patient_id, doctor, cost, visited_on)", "patient", "total cost"),
    ("stores(id, city)", "sales(id, store_id, amount, sold_on)", "store", "sales amount"),
    ("repos(id, name, owner)", "commits(id, repo_id, author, added_lines, committed_at)", "repository",
     "lines added"),
    ("drivers(id, name)", "trips(id, driver_id, distance_km, fare, started_at)", "driver", "fare total"),
]

SQL_INTENTS = [
    "Write a SQL query that returns the {n} {entity}s with the highest {metric}, using tables {a} and {b}.",
    "Write a SQL query over {a} and {b} that counts the rows of the second table per {entity}, largest first.",
    "Given tables {a} and {b}, write a SQL query listing each {entity} whose {metric} is above the average.",
    "Write a SQL query that finds the {entity}s that have no matching row in {b}; the other table is {a}.",
    "Using {a} and {b}, write a SQL query that returns the {metric} per month for the last year.",
    "Write a SQL query with a window function that ranks each {entity} by {metric} (tables {a} and {b}).",
    "Write a SQL statement that creates the tables {a} and {b} with primary and foreign keys.",
]

ALGORITHMS = [
    "quicksort", "merge sort", "insertion sort", "heap sort", "counting sort", "breadth-first search on a graph",
    "depth-first search on a graph", "Dijkstra's shortest path algorithm", "topological sort", "union-find",
    "an LRU cache class", "a stack class", "a queue using two stacks", "a trie with insert and search",
    "the greatest common divisor", "a sieve of Eratosthenes", "a palindrome check", "an anagram check",
    "matrix multiplication", "run-length encoding", "a function that flattens a nested list",
    "a function that merges two sorted lists", "a function that counts word frequencies in a text",
    "a function that parses a CSV line with quoted fields", "a function that validates an email address",
    "a linked list class with append and reverse", "a binary tree class with in-order traversal",
    "a function that returns the factorial of n", "a function that checks whether a number is prime",
    "a function that computes the Levenshtein distance", "a function that rotates a list by k places",
    "a function that finds the longest common prefix of strings", "a rate limiter class",
    "a function that converts Roman numerals to integers", "a function that transposes a matrix",
    "a context manager that times a block of code", "a decorator that retries a function on exceptions",
    "a function that chunks a list into pieces of size n", "a function that deduplicates a list keeping order",
    "a function that reads a JSON file and returns a dict",
]
STYLES = ["Implement {x} in Python.", "Write {x} in Python, with a docstring.",
          "Write {x} in Python with type hints.", "Implement {x} in Python and add a short usage example."]


def leaks(text: str) -> bool:
    low = text.lower()
    return any(w in low for w in EVAL_WORDS)


def _heldout(key: str, every: int) -> bool:
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:4], "big") % every == 0


def _first_sentence(doc: str) -> str | None:
    para = doc.strip().split("\n\n")[0]
    text = " ".join(para.split())
    m = re.match(r"(.{12,200}?[.!?])(\s|$)", text)
    if not m or not text[:1].isalpha() or any(c in text for c in "`:>|="):
        return None
    s = m.group(1)
    return s[0].lower() + s[1:]


def _request(node: ast.stmt) -> str | None:
    """The request for a top-level statement: a documented public function whose docstring's first
    sentence reads as a request after "that" ("returns ...", "computes ..."), or None."""
    if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
        return None
    doc = ast.get_docstring(node)
    summary = _first_sentence(doc) if doc else None
    args = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
    if summary is None or len(args) > 5 or not summary.split()[0].endswith("s"):
        return None
    req = f"Write a Python function `{node.name}({', '.join(args)})` that {summary}"
    return None if leaks(req) else req


_TOP_DEF = re.compile(r"^\f*def\b", re.M)  # where a top-level function (not async) begins
_TOP_LINE = re.compile(r"^[^\s#)\]}]", re.M)  # a line that may begin the next top-level statement


def _head(chunk: str) -> str | None:
    """`chunk` (a `def` and the lines up to the next top-level statement) cut after the first
    statement of the function's body, or None where that statement cannot be a docstring (it
    starts with neither a string nor a parenthesis).  Tokenizes only that far; raises as the
    tokenizer does on broken code."""
    newlines, first = 0, False
    for tok in tokenize.generate_tokens(io.StringIO(chunk).readline):
        if first:
            if tok.type != tokenize.STRING and tok.string != "(":
                return None
            first = False
        if tok.type == tokenize.NEWLINE:
            newlines += 1
            if newlines == 2:  # the header's logical line, then the first statement's
                pos = 0
                for _ in range(tok.end[0]):
                    pos = chunk.find("\n", pos) + 1
                    if pos == 0:
                        return chunk
                return chunk[:pos]
        elif tok.type == tokenize.INDENT and newlines == 1:
            first = True
    return chunk  # a one-line function (`def f(): "..."`)


def _may_request(text: str) -> bool:
    """False only where no top-level function of the module `text` can give a request.  Each `def`
    at the start of a line is looked at alone, through its header and first statement (which hold
    everything `_request` reads); anything that does not tokenize or parse there counts as a maybe.
    A top-level `def` always starts a line, and the cut text is a prefix of the real function, so
    it parses to the same name, arguments and docstring or not at all: no module that gives a
    request is passed over.  (A `def` inside a string may be a false maybe: the caller parses.)"""
    for m in _TOP_DEF.finditer(text):
        end = _TOP_LINE.search(text, m.end())
        try:
            head = _head(text[m.start() : end.start() if end else len(text)])
            if head is not None and any(_request(node) for node in ast.parse(head).body):
                return True
        except (SyntaxError, ValueError, tokenize.TokenError):
            return True
    return False


def function_requests(files: list[Path], root: Path) -> Iterator[tuple[str, str]]:
    """(file, request) for documented public functions, at most two per file.  A file is parsed
    whole only if a quick look at its top-level functions finds one that may give a request
    (about one file in ten here; parsing every file was most of the cost of the banks)."""
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            if not _may_request(text):
                continue
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        n = 0
        for node in tree.body:
            req = _request(node) if n < 2 else None
            if req is not None:
                n += 1
                yield str(path.relative_to(root)), req


def _bank(files: list[Path], root: Path, heldout: bool, every: int, seed: int, limit: int,
          exclude: set[str]) -> list[str]:
    """Up to `limit` requests, two function requests to one SQL or algorithm request; files are
    parsed lazily in a seeded order, so a short bank reads a few hundred files, not all."""
    rng = random.Random(f"{seed}:requests:{heldout}")
    order = list(files)
    rng.shuffle(order)
    fixed = [r for r in _fixed() if _heldout(r, every) == heldout]
    rng.shuffle(fixed)
    funcs = (r for _, r in function_requests(order, root))
    out: list[str] = []
    seen = set(exclude)
    j = 0
    while len(out) < limit:
        if j < len(fixed) and j * 2 <= len(out) - j:
            r, j = fixed[j], j + 1
        else:
            r = next(funcs, None)
            if r is None:
                if j >= len(fixed):
                    break
                r, j = fixed[j], j + 1
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


def _fixed() -> list[str]:
    sql = [t.format(n=n, entity=e, metric=m, a=a, b=b) for a, b, e, m in SCHEMAS for t in SQL_INTENTS
           for n in ([5, 10] if "{n}" in t else [0])]
    algo = [s.format(x=x) for x in ALGORITHMS for s in STYLES]
    return [r for r in sql + algo if not leaks(r)]


def requests(train_files: list[Path], heldout_files: list[Path], root: Path, every: int, seed: int,
             n_train: int, n_heldout: int) -> tuple[list[str], list[str]]:
    """The request banks (held-out, training), at most n_heldout and n_train long: functions from
    each side's files, SQL and algorithm requests split by a hash of their text.  The same function
    can be documented alike in several files (vendored copies), so a training request never
    repeats any request the held-out files give (all of them are read for that: a few seconds)."""
    held = _bank(heldout_files, root, True, every, seed, 10**9, set())
    return held[:n_heldout], _bank(train_files, root, False, every, seed, n_train, set(held))
