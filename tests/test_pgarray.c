/* test_pgarray.c: the PostgreSQL array literals of common/pgarray.h, as text and then read
 * back by a private PostgreSQL: every text element (quotes, backslashes, commas, braces,
 * spaces at either end, the empty string, the word NULL, UTF-8) comes back as itself,
 * an element ends at a NUL, integers at both ends of bigint, a bigint[][] of rows, and
 * reals at the precision asked for. */
#include "common/pgarray.h"
#include "check.h"
#include "dbtest.h"

static const char *TRICKY[] = {"plain",  "",      "NULL",  "null", "a,b",   "{x}",  "say \"hi\"", "back\\slash",
                               "\\\"",   " pad ", "\t\n",  "ü→€",  "\"",    "\\",   "}{,\" \\",  "uuid:train:7"};
#define NTRICKY (int)(sizeof TRICKY / sizeof *TRICKY)

static void test_text_form(void) {
    pgarray a;
    pga_init(&a);
    char *s = pga_end(&a);
    CHECK(!strcmp(s, "{}"), "an empty array is {} (%s)", s);
    free(s);
    pga_init(&a);
    pga_int(&a, 3);
    pga_int(&a, -5);
    pga_int(&a, INT64_MAX);
    s = pga_end(&a);
    CHECK(!strcmp(s, "{3,-5,9223372036854775807}"), "integers, comma-separated (%s)", s);
    free(s);
    pga_init(&a);
    pga_text(&a, "a");
    pga_text(&a, "");
    pga_text(&a, "q\"b\\");
    s = pga_end(&a);
    CHECK(!strcmp(s, "{\"a\",\"\",\"q\\\"b\\\\\"}"), "text always quoted, \" and \\ escaped (%s)", s);
    free(s);
    pga_init(&a);
    pga_textn(&a, "ab\0cd", 5);
    pga_textn(&a, "xyz", 2);
    s = pga_end(&a);
    CHECK(!strcmp(s, "{\"ab\",\"xy\"}"), "an element ends at a NUL or after n bytes (%s)", s);
    free(s);
    pga_init(&a);
    pga_fixed(&a, 0.5, 4);
    pga_fixed(&a, -1, 3);
    s = pga_end(&a);
    CHECK(!strcmp(s, "{0.5000,-1.000}"), "reals at a fixed number of decimals (%s)", s);
    free(s);
    pga_init(&a);
    for (int r = 0; r < 2; r++) {
        pga_open(&a);
        for (int e = 0; e < 3; e++) pga_int(&a, r * 3 + e);
        pga_close(&a);
    }
    s = pga_end(&a);
    CHECK(!strcmp(s, "{{0,1,2},{3,4,5}}"), "rows of a two-dimensional array (%s)", s);
    free(s);
}

static void test_read_back(void) {
    char err[512];
    pgarray a;
    pga_init(&a);
    for (int i = 0; i < NTRICKY; i++) pga_text(&a, TRICKY[i]);
    char *lit = pga_end(&a);
    const char *p[1] = {lit};
    PGresult *r = db_query(C, "SELECT x IS NULL, x FROM unnest($1::text[]) WITH ORDINALITY AS u(x, i) ORDER BY i", 1, p,
                           err, sizeof err);
    CHECK(r != NULL, "PostgreSQL reads the text[] literal (%s)", r ? "" : err);
    int same = 0;
    for (int i = 0; r && i < PQntuples(r) && i < NTRICKY; i++)
        if (!strcmp(PQgetvalue(r, i, 0), "f") && !strcmp(PQgetvalue(r, i, 1), TRICKY[i])) same++;
        else printf("      element %d: sent [%s], read [%s]\n", i, TRICKY[i], PQgetvalue(r, i, 1));
    CHECK(r && PQntuples(r) == NTRICKY && same == NTRICKY, "all %d text elements read back as themselves (%d)", NTRICKY,
          same);
    PQclear(r);
    free(lit);

    pga_init(&a);
    pga_int(&a, INT64_MIN);
    pga_int(&a, 0);
    pga_int(&a, INT64_MAX);
    lit = pga_end(&a);
    p[0] = lit;
    r = db_query(C, "SELECT array_to_string($1::bigint[], ' ')", 1, p, err, sizeof err);
    CHECK(r && !strcmp(PQgetvalue(r, 0, 0), "-9223372036854775808 0 9223372036854775807"),
          "bigint[] at both ends of the range (%s)", r ? PQgetvalue(r, 0, 0) : err);
    PQclear(r);
    free(lit);

    pga_init(&a);
    for (int row = 0; row < 3; row++) {
        pga_open(&a);
        for (int e = 0; e < 4; e++) pga_int(&a, row * 10 + e);
        pga_close(&a);
    }
    lit = pga_end(&a);
    p[0] = lit;
    r = db_query(C, "SELECT array_dims(v), v[3][4] FROM (SELECT $1::bigint[] AS v) x", 1, p, err, sizeof err);
    CHECK(r && !strcmp(PQgetvalue(r, 0, 0), "[1:3][1:4]") && !strcmp(PQgetvalue(r, 0, 1), "23"),
          "bigint[][]: 3 rows of 4 (%s)", r ? PQgetvalue(r, 0, 0) : err);
    PQclear(r);
    free(lit);

    pga_init(&a);
    pga_fixed(&a, 0.12345678, 4);
    pga_fixed(&a, -1, 3);
    lit = pga_end(&a);
    p[0] = lit;
    r = db_query(C, "SELECT array_to_string($1::real[], ' ')", 1, p, err, sizeof err);
    CHECK(r && !strcmp(PQgetvalue(r, 0, 0), "0.1235 -1"), "real[] at the decimals asked for (%s)",
          r ? PQgetvalue(r, 0, 0) : err);
    PQclear(r);
    free(lit);
}

int main(void) {
    test_text_form();
    dbt_start("loom-pga");
    test_read_back();
    dbt_stop();
    return check_summary();
}
