"""Users' Column expressions, made runnable: Spark Connect Columns turned into classic ones.

Defining an App must not start Spark, yet App files build Column expressions
(``F.col("value.total") > 0``) as they define it, and a classic PySpark Column
is a JVM object that needs a running SparkContext. So until Spark runs, the
App lets PySpark build Spark Connect Columns instead (see
:func:`tablecast.pipeline.run.spark.defer_columns`): plain Python expression
trees that need no JVM. When the pipeline starts, this module rebuilds each
of them as the classic Column it stands for, node by node; a classic Column
(Spark was already running when it was built) passes unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

#: Column operators of Spark Connect (function names on the wire) and their classic forms
_BINARY: dict[str, Callable[[Column, Column], Column]] = {
    "==": lambda a, b: a == b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<=>": lambda a, b: a.eqNullSafe(b),
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "%": lambda a, b: a % b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "&": lambda a, b: a.bitwiseAND(b),
    "|": lambda a, b: a.bitwiseOR(b),
    "^": lambda a, b: a.bitwiseXOR(b),
}
_UNARY: dict[str, Callable[[Column], Column]] = {
    "not": lambda a: ~a,
    "negative": lambda a: -a,
    "isNull": lambda a: a.isNull(),
    "isNotNull": lambda a: a.isNotNull(),
}


def classic(col: Any) -> Column:
    """`col` as a classic Column (Spark must be running)."""
    if not _is_connect(col):
        return col
    return _convert(col._expr, {})


def _is_connect(col: Any) -> bool:
    return type(col).__module__.startswith("pyspark.sql.connect")


def _convert(expr: Any, lambdas: dict[str, Column]) -> Column:
    from pyspark.sql.connect import expressions as cx

    def conv(e: Any) -> Column:
        return _convert(e, lambdas)

    if isinstance(expr, cx.ColumnReference):
        return F.col(expr._unparsed_identifier)
    if isinstance(expr, cx.LiteralExpression):
        # classic lit() infers the type Spark Connect chose from the same Python value, and
        # a cast would hide the literal from what needs one (a struct field's name)
        return F.lit(expr._value)
    if isinstance(expr, cx.ColumnAlias):
        return conv(expr._child).alias(*expr._alias, metadata=expr._metadata)
    if isinstance(expr, cx.CastExpression):
        child, to = conv(expr._expr), _type(expr._data_type)
        return child.try_cast(to) if expr._eval_mode == "try" else child.cast(to)
    if isinstance(expr, cx.CaseWhen):
        out = None
        for cond, value in expr._branches:
            out = (
                F.when(conv(cond), conv(value))
                if out is None
                else out.when(conv(cond), conv(value))
            )
        assert out is not None
        return out if expr._else_value is None else out.otherwise(conv(expr._else_value))
    if isinstance(expr, cx.UnresolvedExtractValue):
        return conv(expr._child)[conv(expr._extraction)]
    if isinstance(expr, cx.SQLExpression):
        return F.expr(expr._expr)
    if isinstance(expr, cx.UnresolvedStar):
        return F.col(f"{expr._unparsed_target}*" if expr._unparsed_target else "*")
    if isinstance(expr, cx.WithField):
        return conv(expr._structExpr).withField(expr._fieldName, conv(expr._valueExpr))
    if isinstance(expr, cx.DropField):
        return conv(expr._structExpr).dropFields(expr._fieldName)
    if isinstance(expr, cx.UnresolvedNamedLambdaVariable):
        return lambdas[".".join(expr._name_parts)]
    if isinstance(expr, cx.UnresolvedFunction | cx.CallFunction):
        name, args = expr._name, list(expr._args)
        if getattr(expr, "_is_distinct", False):
            raise TypeError(f"{name}(DISTINCT ...) is an aggregate: it has no place in an operator")
        if name in _BINARY and len(args) == 2:
            return _BINARY[name](conv(args[0]), conv(args[1]))
        if name in _UNARY and len(args) == 1:
            return _UNARY[name](conv(args[0]))
        plain = [conv(a) for a in args if not isinstance(a, cx.LambdaFunction)]
        funs = [_lambda(a, lambdas) for a in args if isinstance(a, cx.LambdaFunction)]
        return _call(name, plain, funs)
    if isinstance(expr, cx.CommonInlineUserDefinedFunction):
        return _udf(expr, [conv(a) for a in expr._arguments])
    raise TypeError(
        f"this Column cannot be used before Spark runs ({type(expr).__name__}: {expr}); "
        "start Spark first (tablecast.pipeline.run.spark.session()) or use a Python callable"
    )


def _type(data_type: Any) -> Any:
    # a type given as a string stays unparsed in Spark Connect: classic cast() parses it
    text = getattr(data_type, "data_type_string", None)
    return text if text is not None else data_type


def _call(name: str, cols: list[Column], lambdas: list[Any]) -> Column:
    """The built-in function `name` (a higher-order one with its lambdas after its columns)."""
    from pyspark import SparkContext
    from pyspark.sql.classic.column import _to_seq

    sc = SparkContext._active_spark_context
    assert sc is not None and sc._jvm is not None
    jcols = [c._jc for c in cols] + lambdas  # type: ignore[attr-defined]
    return Column(sc._jvm.PythonSQLUtils.fn(name, _to_seq(sc, jcols)))  # type: ignore[call-arg]


def _lambda(expr: Any, outer: dict[str, Column]) -> Any:
    """A Spark Connect lambda as the JVM LambdaFunction classic higher-order functions take."""
    from pyspark import SparkContext
    from pyspark.sql.classic.column import _to_seq

    sc = SparkContext._active_spark_context
    assert sc is not None and sc._jvm is not None
    jvm = sc._jvm
    names = [".".join(a._name_parts) for a in expr._arguments]
    variables = {n: Column(jvm.PythonSQLUtils.unresolvedNamedLambdaVariable(n)) for n in names}  # type: ignore[call-arg]
    body = _convert(expr._function, {**outer, **variables})
    args = _to_seq(sc, [variables[n]._jc for n in names])  # type: ignore[attr-defined]
    return jvm.PythonSQLUtils.lambdaFunction(body._jc, args)  # type: ignore[attr-defined]


def _udf(expr: Any, args: list[Column]) -> Column:
    """A Python UDF defined while Spark did not run, as the classic UDF it describes."""
    from pyspark.sql.udf import UserDefinedFunction

    fn = expr._function
    if not hasattr(fn, "_func"):
        raise TypeError(f"a Java UDF ({expr._function_name}) needs Spark running when defined")
    udf = UserDefinedFunction(
        fn._func,
        returnType=_type(fn._output_type),
        name=expr._function_name,
        evalType=fn._eval_type,
        deterministic=expr._deterministic,
    )
    return udf(*args)
