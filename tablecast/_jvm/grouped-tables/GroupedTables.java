package tablecast.spark;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.CatalystTypeConverters$;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Alias;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.MutableProjection;
import org.apache.spark.sql.catalyst.expressions.Unevaluable;
import org.apache.spark.sql.catalyst.optimizer.ReplaceExpressions$;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import scala.Function1;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A table group_by whose selection and aggregation are Spark Columns, as two transformWithState
 * processors in one query: Spark runs them in the JVM, in micro-batches or in Real-time Mode,
 * with no Python worker, and shuffles the first one's changes to their group key for the second.
 * Both operators' state is committed with the same batch, so a replay after a crash starts both
 * from the same point and nothing reaches the second twice.
 *
 * <p>{@link Retract} (by source key) keeps each source row's last selection, packed (group key,
 * group value), and turns every record of the row into a change: a retraction of the old
 * selection and an addition of the new one (one record when the group key stays), keyed by group
 * key, carrying the source row's key.
 *
 * <p>{@link Aggregate} (by group key) applies each change with the user's subtractor and adder,
 * Catalyst expressions over columns key, value and aggregate, bound on the driver.
 *
 * <p>Rows arrive in the envelope's column order (tablecast/pipeline/compile/envelope.py); bad
 * rows pass through untouched, for the sink to dead-letter.
 */
public final class GroupedTables {
  private GroupedTables() {}

  // positions in the envelope
  static final int KEY = 0, VALUE = 1, ERR = 2, RAW_KEY = 3, RAW_VALUE = 4, TOPIC = 5;
  static final int PART = 6, OFF = 7, SEQ = 8, TS = 9, WIDTH = 10;

  /** Source order: partition, offset, then a record's place among those its offset made. */
  static final Comparator<Row> SOURCE_ORDER =
      (a, b) -> {
        int c = Integer.compare(intAt(a, PART), intAt(b, PART));
        if (c == 0) c = Long.compare(longAt(a, OFF), longAt(b, OFF));
        return c != 0 ? c : Long.compare(longAt(a, SEQ), longAt(b, SEQ));
      };

  static int intAt(Row r, int i) {
    return r.isNullAt(i) ? -1 : r.getInt(i);
  }

  static long longAt(Row r, int i) {
    return r.isNullAt(i) ? -1 : r.getLong(i);
  }

  /** Groups by a row's key bytes (a bad row's may be null: it only passes through). */
  static final MapFunction<Row, byte[]> KEY_BYTES =
      r -> r.isNullAt(KEY) ? new byte[0] : (byte[]) r.get(KEY);

  /** The retraction over `df` (envelope rows, value a packed selection or null). */
  public static Dataset<Row> retract(Dataset<Row> df, String old, String src) {
    StructType out = df.schema().add(old, DataTypes.BinaryType).add(src, DataTypes.BinaryType);
    return df.groupByKey(KEY_BYTES, Encoders.BINARY())
        .transformWithState(
            new Retract(), TimeMode.None(), OutputMode.Update(), Encoders.row(out));
  }

  /**
   * The aggregation over `df`: rows of the envelope's columns plus `gk`, `gv`, `gold` (the
   * group key, new and old group value, decoded) and the change's source row `src`. `adder` and
   * `subtractor` are one-column selections over (key, value, aggregate) whose column is the new
   * aggregate; `initializer` (null for a reduce) a one-column selection whose column starts one;
   * `fits` (null: not checked here) one whose column is whether the table's value serde can write
   * the aggregate.
   */
  public static Dataset<Row> aggregate(
      Dataset<Row> df,
      Dataset<Row> adder,
      Dataset<Row> subtractor,
      Dataset<Row> initializer,
      Dataset<Row> fits,
      String gk,
      String gv,
      String gold,
      String src) {
    DataType agg = adder.schema().fields()[0].dataType();
    StructType out =
        new StructType()
            .add(df.schema().fields()[KEY])
            .add("value", agg)
            .add(df.schema().fields()[ERR])
            .add(df.schema().fields()[RAW_KEY])
            .add(df.schema().fields()[RAW_VALUE])
            .add(df.schema().fields()[TOPIC])
            .add(df.schema().fields()[PART])
            .add(df.schema().fields()[OFF])
            .add(df.schema().fields()[SEQ])
            .add(df.schema().fields()[TS]);
    Aggregate processor =
        new Aggregate(
            Bound.of(adder),
            Bound.of(subtractor),
            initializer == null ? null : Bound.of(initializer),
            fits == null ? null : Bound.of(fits),
            df.schema().fieldIndex(gk),
            df.schema().fieldIndex(gv),
            df.schema().fieldIndex(gold),
            df.schema().fieldIndex(src),
            df.schema().apply(gk).dataType(),
            df.schema().apply(gv).dataType());
    return df.groupByKey(KEY_BYTES, Encoders.BINARY())
        .transformWithState(processor, TimeMode.None(), OutputMode.Update(), Encoders.row(out));
  }

  static scala.collection.Iterator<Row> iterator(List<Row> rows) {
    return CollectionConverters.asScala(rows.iterator());
  }

  static List<Row> sorted(scala.collection.Iterator<Row> rows) {
    List<Row> in = new ArrayList<>();
    while (rows.hasNext()) in.add(rows.next());
    in.sort(SOURCE_ORDER);
    return in;
  }

  static byte[] groupKey(byte[] packed) {
    if (packed == null) return null;
    int n = ByteBuffer.wrap(packed, 0, 4).getInt();
    return Arrays.copyOfRange(packed, 4, 4 + n);
  }

  static byte[] groupValue(byte[] packed) {
    if (packed == null) return null;
    int n = ByteBuffer.wrap(packed, 0, 4).getInt();
    return Arrays.copyOfRange(packed, 4 + n, packed.length);
  }

  /** A source row's last selection. */
  static final StructType SELECTION = new StructType().add("selection", DataTypes.BinaryType);

  public static final class Retract extends StatefulProcessor<byte[], Row, Row> {
    private transient ValueState<Row> last;

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      last = getHandle().getValueState("selection", Encoders.row(SELECTION), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        byte[] key, scala.collection.Iterator<Row> rows, TimerValues timers) {
      List<Row> out = new ArrayList<>();
      byte[] before = last.exists() ? (byte[]) last.get().get(0) : null;
      boolean changed = false;
      for (Row r : sorted(rows)) {
        if (!r.isNullAt(ERR)) {
          out.add(passed(r));
          continue;
        }
        byte[] now = (byte[]) r.get(VALUE);
        byte[] og = groupKey(before), ov = groupValue(before);
        byte[] ng = groupKey(now), nv = groupValue(now);
        if (og != null && Arrays.equals(og, ng)) {
          out.add(change(r, og, nv, ov, key));
        } else {
          if (og != null) out.add(change(r, og, null, ov, key));
          if (ng != null) out.add(change(r, ng, nv, null, key));
        }
        before = now;
        changed = true;
      }
      if (changed) {
        if (before == null) last.clear();
        else last.update(RowFactory.create((Object) before));
      }
      return iterator(out);
    }

    /** The change `r` makes to group `gk`: the source row's timestamp and coordinates. */
    private static Row change(Row r, byte[] gk, byte[] gv, byte[] old, byte[] src) {
      Object[] v = new Object[WIDTH + 2];
      v[KEY] = gk;
      v[VALUE] = gv;
      v[TOPIC] = r.get(TOPIC);
      v[PART] = r.get(PART);
      v[OFF] = r.get(OFF);
      v[SEQ] = r.get(SEQ);
      v[TS] = r.get(TS);
      v[WIDTH] = old;
      v[WIDTH + 1] = src;
      return RowFactory.create(v);
    }

    /** A bad row, passed through for the sink to dead-letter. */
    private static Row passed(Row r) {
      Object[] v = new Object[WIDTH + 2];
      for (int i = 0; i < WIDTH; i++) v[i] = r.get(i);
      return RowFactory.create(v);
    }
  }

  /** A one-column selection's expression with the attributes it reads, to evaluate anywhere. */
  static final class Bound implements java.io.Serializable {
    final Expression expression;
    final scala.collection.immutable.Seq<Attribute> input;
    final DataType type;

    Bound(Expression expression, scala.collection.immutable.Seq<Attribute> input, DataType type) {
      this.expression = expression;
      this.input = input;
      this.type = type;
    }

    static Bound of(Dataset<Row> selection) {
      // functions such as nvl or try_add evaluate only as what the optimizer replaces them by
      LogicalPlan plan = ReplaceExpressions$.MODULE$.apply(selection.queryExecution().analyzed());
      if (!(plan instanceof Project)) {
        throw new IllegalArgumentException(
            "a table fold's Columns are expressions over key, value and aggregate, evaluated "
                + "change by change; not "
                + plan.simpleString(100));
      }
      Project p = (Project) plan;
      Expression e = (Expression) p.projectList().head();
      if (e instanceof Alias) e = ((Alias) e).child();
      scala.Option<Expression> unevaluable =
          e.find(x -> x instanceof Unevaluable && !(x instanceof Attribute));
      if (unevaluable.isDefined()) {
        throw new IllegalArgumentException(
            "a table fold's Columns are evaluated change by change in the JVM, which "
                + unevaluable.get().prettyName()
                + " cannot be (a Python UDF, an aggregate or window function)");
      }
      return new Bound(e, p.child().output(), selection.schema().fields()[0].dataType());
    }

    MutableProjection projection() {
      List<Expression> one = List.of(expression);
      MutableProjection p =
          MutableProjection.create(CollectionConverters.asScala(one).toSeq(), input);
      p.initialize(TaskContext.getPartitionId()); // rand() and the like are seeded per partition
      return p;
    }
  }

  /**
   * What a source row still contributes to its group after a change that failed (its old value,
   * or null once subtracted), which its next change takes back in place of the old value it
   * carries.
   */
  static StructType held(DataType value) {
    return new StructType().add("value", value);
  }

  public static final class Aggregate extends StatefulProcessor<byte[], Row, Row> {
    private final Bound adder, subtractor, initializer, fits;
    private final int gk, gv, gold, src;
    private final DataType keyType, valueType, aggType;
    private transient ValueState<Row> aggregate;
    private transient MapState<byte[], Row> held;
    private transient MutableProjection add, subtract, start, check;
    // a change is folded in Catalyst's values, converted once each way: per change, the
    // generic conversion cost more than the user's expressions
    private transient Function1<Object, Object> keyIn, valueIn, aggIn, aggOut, valueOut;

    Aggregate(
        Bound adder,
        Bound subtractor,
        Bound initializer,
        Bound fits,
        int gk,
        int gv,
        int gold,
        int src,
        DataType keyType,
        DataType valueType) {
      this.adder = adder;
      this.subtractor = subtractor;
      this.initializer = initializer;
      this.fits = fits;
      this.gk = gk;
      this.gv = gv;
      this.gold = gold;
      this.src = src;
      this.keyType = keyType;
      this.valueType = valueType;
      this.aggType = adder.type; // the selections are cast to the aggregate's type
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      StructType agg = new StructType().add("aggregate", aggType).add("ts", DataTypes.LongType);
      aggregate = getHandle().getValueState("aggregate", Encoders.row(agg), TTLConfig.NONE());
      held =
          getHandle()
              .getMapState(
                  "held", Encoders.BINARY(), Encoders.row(held(valueType)), TTLConfig.NONE());
      add = adder.projection();
      subtract = subtractor.projection();
      start = initializer == null ? null : initializer.projection();
      check = fits == null ? null : fits.projection();
      var conv = CatalystTypeConverters$.MODULE$;
      keyIn = conv.createToCatalystConverter(keyType);
      valueIn = conv.createToCatalystConverter(valueType);
      aggIn = conv.createToCatalystConverter(aggType);
      aggOut = conv.createToScalaConverter(aggType);
      valueOut = conv.createToScalaConverter(valueType);
    }

    /** `p` over Catalyst values key, value and aggregate: its column, a Catalyst value. */
    private static Object eval(
        MutableProjection p, DataType type, Object key, Object value, Object agg) {
      // copied: a projection may reuse what it returned for its next row
      return InternalRow.copyValue(
          p.apply(new GenericInternalRow(new Object[] {key, value, agg})).get(0, type));
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        byte[] key, scala.collection.Iterator<Row> rows, TimerValues timers) {
      List<Row> out = new ArrayList<>();
      Row stored = aggregate.exists() ? aggregate.get() : null;
      boolean had = stored != null;
      Object current = had ? aggIn.apply(stored.get(0)) : null;
      Long ts = had && !stored.isNullAt(1) ? stored.getLong(1) : null;
      Row last = null;
      Object k = null; // every change of the group has its key, converted once
      // a row's value is held only after a change failed: most groups have none to look up
      boolean anyHeld = held.exists();
      for (Row r : sorted(rows)) {
        if (!r.isNullAt(ERR)) {
          out.add(bad(r, r.getString(ERR)));
          continue;
        }
        byte[] source = (byte[]) r.get(src);
        Row kept = anyHeld && held.containsKey(source) ? held.getValue(source) : null;
        if (k == null) k = keyIn.apply(r.get(gk));
        Object old = valueIn.apply(kept != null ? kept.get(0) : r.get(gold));
        Object nv = valueIn.apply(r.get(gv));
        Object after = current;
        boolean subtracted = false;
        String failure = null;
        try {
          if (old != null && current != null) after = eval(subtract, aggType, k, old, current);
          subtracted = true;
          if (nv != null) {
            if (after == null) {
              after = start == null ? nv : eval(start, aggType, k, null, null);
              if (start != null) after = eval(add, aggType, k, nv, after);
            } else {
              after = eval(add, aggType, k, nv, after);
            }
          }
        } catch (RuntimeException e) {
          failure = (subtracted ? "adder: " : "subtractor: ") + e;
        }
        if (failure == null && after != null && check != null) {
          if (!fits(k, after)) {
            // an aggregate the table cannot hold: the change is not made
            failure = "the aggregate does not fit the table's value serde";
            subtracted = false;
          }
        }
        if (failure != null) {
          // dead-letter this change and remember what the row really contributes (still its
          // old value, or nothing once subtracted), which a later retraction takes back
          out.add(bad(r, failure));
          if (subtracted) {
            current = after;
            last = r;
            ts = later(ts, r);
          }
          held.updateValue(source, RowFactory.create(subtracted ? null : valueOut.apply(old)));
          anyHeld = true;
          continue;
        }
        current = after;
        if (kept != null) held.removeKey(source);
        last = r;
        ts = later(ts, r);
      }
      if (last != null) {
        Object result = current == null ? null : aggOut.apply(current);
        if (result == null) aggregate.clear();
        else aggregate.update(RowFactory.create(result, ts));
        Object[] v = new Object[WIDTH];
        v[KEY] = key;
        v[VALUE] = result;
        v[PART] = last.get(PART);
        v[OFF] = last.get(OFF);
        v[SEQ] = last.get(SEQ);
        v[TS] = ts;
        out.add(RowFactory.create(v));
      }
      return iterator(out);
    }

    /** Whether the table's value serde writes `agg` (an encoding that raises does not). */
    private boolean fits(Object key, Object agg) {
      try {
        return Boolean.TRUE.equals(eval(check, DataTypes.BooleanType, key, null, agg));
      } catch (RuntimeException e) {
        return false;
      }
    }

    private static Long later(Long ts, Row r) {
      if (r.isNullAt(TS)) return ts;
      long t = r.getLong(TS);
      return ts == null || t > ts ? t : ts;
    }

    /** `r` as a bad row: what it was read as, and why. */
    private static Row bad(Row r, String why) {
      Object[] v = new Object[WIDTH];
      for (int i = 0; i < WIDTH; i++) v[i] = i == VALUE ? null : r.get(i);
      v[ERR] = why;
      return RowFactory.create(v);
    }
  }
}
