// Runs SQL through node-postgres (npm's `pg`): one JSON line per statement read from
// standard input as {"sql": ..., "params": [...]}, printing {"fields", "rows"} with the
// values as `pg` parses them, or {"error": SQLSTATE, "message"}.
// Argument: a connection string.
const { Client } = require("pg");
const readline = require("readline");

async function main() {
  const client = new Client({ connectionString: process.argv[2] });
  await client.connect();
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line) continue;
    const { sql, params, name } = JSON.parse(line);
    try {
      const res = await client.query({ text: sql, values: params || [], name });
      console.log(JSON.stringify({ fields: res.fields.map((f) => f.name), rows: res.rows }));
    } catch (e) {
      console.log(JSON.stringify({ error: e.code || null, message: e.message }));
    }
  }
  await client.end();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
