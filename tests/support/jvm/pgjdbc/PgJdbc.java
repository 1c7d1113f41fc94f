import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.util.Properties;

/**
 * Runs SQL through pgJDBC, one statement per line of standard input (a statement, then its
 * parameters, separated by tabs, each set with setString or, when it parses, setLong),
 * and prints one JSON line per statement: {"columns": [...], "rows": [[...]]} with every
 * value as getString gives it, or {"error": SQLSTATE, "message": ...}.
 *
 * Arguments: the JDBC URL, the user, the password.
 */
public class PgJdbc {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", args[1]);
        props.setProperty("password", args[2]);
        try (Connection conn = DriverManager.getConnection(args[0], props)) {
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) {
                    continue;
                }
                String[] parts = line.split("\t");
                System.out.println(run(conn, parts));
                System.out.flush();
            }
        }
    }

    static String run(Connection conn, String[] parts) {
        if (parts[0].startsWith("META ")) {
            return meta(conn, parts[0].substring(5).split(" "));
        }
        try (PreparedStatement ps = conn.prepareStatement(parts[0])) {
            for (int i = 1; i < parts.length; i++) {
                String p = parts[i];
                if (p.startsWith("long:")) {
                    ps.setLong(i, Long.parseLong(p.substring(5)));
                } else {
                    ps.setString(i, p);
                }
            }
            StringBuilder out = new StringBuilder("{\"columns\":[");
            try (ResultSet rs = ps.executeQuery()) {
                ResultSetMetaData md = rs.getMetaData();
                for (int c = 1; c <= md.getColumnCount(); c++) {
                    out.append(c > 1 ? "," : "").append(quote(md.getColumnLabel(c)));
                }
                out.append("],\"rows\":[");
                boolean first = true;
                while (rs.next()) {
                    out.append(first ? "[" : ",[");
                    first = false;
                    for (int c = 1; c <= md.getColumnCount(); c++) {
                        out.append(c > 1 ? "," : "").append(quote(rs.getString(c)));
                    }
                    out.append("]");
                }
            }
            return out.append("]}").toString();
        } catch (SQLException e) {
            return "{\"error\":" + quote(e.getSQLState()) + ",\"message\":" + quote(e.getMessage()) + "}";
        }
    }

    /** DatabaseMetaData: "tables", "columns TABLE" or "pk TABLE", as JSON rows of the
     * columns tools read (table name; column name and type name; key column name). */
    static String meta(Connection conn, String[] what) {
        try {
            DatabaseMetaData md = conn.getMetaData();
            ResultSet rs;
            String[] columns;
            if (what[0].equals("tables")) {
                rs = md.getTables(null, "public", "%", new String[] {"TABLE"});
                columns = new String[] {"TABLE_NAME"};
            } else if (what[0].equals("columns")) {
                rs = md.getColumns(null, "public", what[1], "%");
                columns = new String[] {"COLUMN_NAME", "TYPE_NAME"};
            } else {
                rs = md.getPrimaryKeys(null, "public", what[1]);
                columns = new String[] {"COLUMN_NAME"};
            }
            StringBuilder out = new StringBuilder("{\"rows\":[");
            boolean first = true;
            while (rs.next()) {
                out.append(first ? "[" : ",[");
                first = false;
                for (int c = 0; c < columns.length; c++) {
                    out.append(c > 0 ? "," : "").append(quote(rs.getString(columns[c])));
                }
                out.append("]");
            }
            rs.close();
            return out.append("]}").toString();
        } catch (SQLException e) {
            return "{\"error\":" + quote(e.getSQLState()) + ",\"message\":" + quote(e.getMessage()) + "}";
        }
    }

    static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            if (ch == '"' || ch == '\\') {
                b.append('\\').append(ch);
            } else if (ch < 0x20) {
                b.append(String.format("\\u%04x", (int) ch));
            } else {
                b.append(ch);
            }
        }
        return b.append('"').toString();
    }
}
