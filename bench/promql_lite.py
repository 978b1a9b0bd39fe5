"""Just enough PromQL to draw docs/metrics/grafana-dashboard.json's panels from recorded scrapes
(bench/dashboard.py): selectors with = and =~ matchers, [range], rate, changes,
histogram_quantile, sum/min/max [by (...)], absent, `/` between vectors and `==` / `>` against a
number (the dashboard's panels and docs/metrics/alerts.yaml's rules).
A query outside that subset raises, so the picture never shows something the dashboard would
not."""

import math
import re

TOKEN = re.compile(r'\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)|(?P<str>"(?:[^"\\]|\\.)*")'
                   r'|(?P<op>==|=~|[(){}\[\],=/>]))')


def tokenize(text):
    pos, out = 0, []
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"cannot read {text[pos:]!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def duration(text):
    m = re.fullmatch(r"(\d+)([smh])", text)
    if not m:
        raise ValueError(f"duration {text!r}")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


class Parser:
    def __init__(self, text, rate_interval):
        self.tokens = tokenize(text.replace("$__rate_interval", f"{rate_interval}s"))
        self.i = 0

    def peek(self, value=None):
        t = self.tokens[self.i] if self.i < len(self.tokens) else (None, None)
        return t if value is None or t[1] == value else None

    def take(self, value=None):
        t = self.peek()
        if value is not None and t[1] != value:
            raise ValueError(f"expected {value!r}, got {t[1]!r}")
        self.i += 1
        return t

    def parse(self):
        node = self.expr()
        if self.i != len(self.tokens):
            raise ValueError(f"trailing {self.tokens[self.i:]}")
        return node

    def expr(self):
        left = self.term()
        while self.peek("/") or self.peek("==") or self.peek(">"):
            op = self.take()[1]
            left = ("binop", op, left, self.term())
        return left

    def term(self):
        kind, value = self.peek()
        if kind == "num":
            self.take()
            return ("num", float(value))
        if kind == "op" and value == "(":
            self.take()
            node = self.expr()
            self.take(")")
            return node
        name = self.take()[1]
        if name in ("sum", "min", "max"):
            by = None
            if self.peek("by"):
                self.take()
                self.take("(")
                by = []
                while not self.peek(")"):
                    by.append(self.take()[1])
                    if self.peek(","):
                        self.take()
                self.take(")")
            self.take("(")
            arg = self.expr()
            self.take(")")
            return ("agg", name, by, arg)
        if name == "absent":
            self.take("(")
            arg = self.expr()
            self.take(")")
            return ("absent", arg)
        if name in ("rate", "changes"):
            self.take("(")
            arg = self.term()
            self.take(")")
            if arg[0] != "range":
                raise ValueError(f"{name} needs a range")
            return ("func", name, arg)
        if name == "histogram_quantile":
            self.take("(")
            q = float(self.take()[1])
            self.take(",")
            arg = self.expr()
            self.take(")")
            return ("quantile", q, arg)
        matchers = []
        if self.peek("{"):
            self.take()
            while not self.peek("}"):
                label = self.take()[1]
                op = self.take()[1]
                text = self.take()[1][1:-1]
                matchers.append((label, op, text))
                if self.peek(","):
                    self.take()
            self.take("}")
        node = ("sel", name, matchers)
        if self.peek("["):
            self.take()
            seconds = duration(self.take()[1] + self.take()[1]) if self.peek()[0] == "num" else None
            self.take("]")
            node = ("range", node, seconds)
        return node


def matches(labels, matchers, variables):
    d = dict(labels)
    for label, op, text in matchers:
        for var, val in variables.items():
            text = text.replace(f"${var}", val)
        v = d.get(label, "")
        if op == "=" and v != text or op == "=~" and not re.fullmatch(text, v):
            return False
    return True


class Evaluator:
    """scrapes: [(t, {(name, labels): value})], oldest first."""

    def __init__(self, scrapes, variables):
        self.scrapes = scrapes
        self.variables = variables

    def at(self, node, i):
        kind = node[0]
        if kind == "num":
            return node[1]
        if kind == "sel":
            _, name, matchers = node
            return {labels: v for (n, labels), v in self.scrapes[i][1].items()
                    if n == name and matches(labels, matchers, self.variables)}
        if kind == "func":
            _, fn, (_, sel, seconds) = node
            t = self.scrapes[i][0]
            j = i
            while j > 0 and t - self.scrapes[j - 1][0] <= seconds:
                j -= 1
            if j == i:
                return {}
            now = self.at(sel, i)
            out = {}
            for labels, v in now.items():
                series = [self.at(sel, k).get(labels) for k in range(j, i + 1)]
                series = [x for x in series if x is not None]
                if fn == "changes":
                    out[labels] = float(sum(1 for a, b in zip(series, series[1:]) if a != b))
                else:
                    increase = sum(b - a if b >= a else b for a, b in zip(series, series[1:]))
                    out[labels] = increase / (t - self.scrapes[j][0])
            return out
        if kind == "agg":
            _, fn, by, arg = node
            groups = {}
            for labels, v in self.at(arg, i).items():
                key = tuple((k, val) for k, val in labels if by is not None and k in by)
                groups.setdefault(key, []).append(v)
            f = {"sum": sum, "min": min, "max": max}[fn]
            return {k: f(vs) for k, vs in groups.items()}
        if kind == "quantile":
            _, q, arg = node
            by_rest = {}
            for labels, v in self.at(arg, i).items():
                d = dict(labels)
                le = float(d.pop("le"))
                by_rest.setdefault(tuple(sorted(d.items())), []).append((le, v))
            return {k: quantile(q, sorted(b)) for k, b in by_rest.items()}
        if kind == "absent":
            # 1 with the selector's equality labels when the vector is empty, else nothing.
            _, arg = node
            if self.at(arg, i):
                return {}
            labels = tuple(sorted((l, t) for l, op, t in arg[2] if op == "=")) if arg[0] == "sel" else ()
            return {labels: 1.0}
        if kind == "binop":
            _, op, left, right = node
            a, b = self.at(left, i), self.at(right, i)
            if op == "==":
                return {k: v for k, v in a.items() if v == b}
            if op == ">":
                return {k: v for k, v in a.items() if v > b}
            return {k: (v / b[k] if b[k] else math.nan) for k, v in a.items() if k in b}
        raise ValueError(kind)


def quantile(q, buckets):
    """Prometheus's histogram_quantile over [(le, cumulative count)], +Inf last."""
    if not buckets or buckets[-1][1] == 0:
        return math.nan
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_count) / (count - prev_count) if count > prev_count else 0)
        prev_le, prev_count = le, count
    return prev_le


def series(expr, scrapes, variables, rate_interval):
    """{labels: [(t, value)]} of a query evaluated at every scrape."""
    node = Parser(expr, rate_interval).parse()
    ev = Evaluator(scrapes, variables)
    out = {}
    for i, (t, _) in enumerate(scrapes):
        for labels, v in ev.at(node, i).items():
            out.setdefault(labels, []).append((t, v))
    return out
