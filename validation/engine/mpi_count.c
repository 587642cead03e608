/* Counts what amsp hands to MPI's collectives, per communicator and operation,
 * through the MPI profiling interface: loaded with LD_PRELOAD, it defines the
 * collectives amsp calls, counts, and forwards each to its PMPI_ twin. At
 * MPI_Finalize every rank writes $AMSP_MPI_COUNT_DIR/rank-<world rank>.json:
 *
 *   {"P": {"size": 2, "all_gather": {"calls": 14, "elements": 1049984, "bytes": 4199936,
 *                                    "blocks": 524992}, ...}, ...}
 *
 * keyed by the communicator's name (MPI_Comm_get_name; amsp names its groups),
 * "elements" summing each call's count argument (the per-rank block of an
 * all-gather or reduce-scatter, the buffer of an all-reduce or broadcast, the
 * block sent to each rank by an all-to-all: amsp's bf16 sums exchange their
 * blocks with one, see doc/communication.md) and
 * "bytes" that times the datatype's size, "blocks" each count divided by the
 * communicator's size, rounded up (an all-reduce's padded block). This is the payload given to MPI, not
 * the point-to-point traffic of MPICH's algorithms, which PMPI cannot see; the
 * test converts it to per-rank bytes with the bandwidth-optimal model itself.
 * Independent of amsp's own accounting: nothing here calls amsp code.
 *
 * With AMSP_MPI_COUNT_MARK=NAME every collective call on the communicator named
 * NAME also takes a snapshot of all counts so far, that call included, and each
 * rank writes them, in order, to $AMSP_MPI_COUNT_DIR/rank-<world rank>-marks.json
 * as a list of objects of the form above. The engine's gradient norm is its only
 * collective on "world", once per step: two consecutive marks bracket one whole
 * step, and one run of a few steps gives a step's counts (validation/engine/wire_test.py). */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMMS 64
enum { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE, OP_BROADCAST, OP_ALL_TO_ALL, NUM_OPS };
static const char* const op_names[NUM_OPS] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                              "all_to_all"};

struct counts {
  char name[MPI_MAX_OBJECT_NAME];
  int size;
  long long calls[NUM_OPS], elements[NUM_OPS], bytes[NUM_OPS];
  long long blocks[NUM_OPS];  /* sum of ceil(count / size): an all-reduce's padded block */
};
static struct counts table[MAX_COMMS];
static int used = 0;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_MARKS 32
struct snapshot {
  struct counts table[MAX_COMMS];
  int used;
};
static struct snapshot marks[MAX_MARKS];
static int marked = 0, lost_marks = 0;

static void count(MPI_Comm comm, int op, long long elements, MPI_Datatype type) {
  char name[MPI_MAX_OBJECT_NAME] = "";
  int len = 0, size = 0, ranks = 1;
  PMPI_Comm_get_name(comm, name, &len);
  PMPI_Type_size(type, &size);
  PMPI_Comm_size(comm, &ranks);
  if (!name[0]) snprintf(name, sizeof name, "(unnamed)");
  pthread_mutex_lock(&lock);
  int i = 0;
  while (i < used && strcmp(table[i].name, name) != 0) ++i;
  if (i == used && used < MAX_COMMS) {
    memset(&table[i], 0, sizeof table[i]);
    snprintf(table[i].name, sizeof table[i].name, "%s", name);
    table[i].size = ranks;
    ++used;
  }
  if (i < MAX_COMMS) {
    table[i].calls[op] += 1;
    table[i].elements[op] += elements;
    table[i].bytes[op] += elements * size;
    table[i].blocks[op] += (elements + ranks - 1) / ranks;
  }
  const char* mark = getenv("AMSP_MPI_COUNT_MARK");
  if (mark && *mark && strcmp(mark, name) == 0) {
    if (marked < MAX_MARKS) {
      memcpy(marks[marked].table, table, sizeof table);
      marks[marked].used = used;
      ++marked;
    } else {
      ++lost_marks;
    }
  }
  pthread_mutex_unlock(&lock);
}

/* With MPI_IN_PLACE the send count and type are ignored (MPI's rule): count the
 * receive side's per-rank block instead. */
int MPI_Allgather(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, MPI_Comm c) {
  if (s == MPI_IN_PLACE) count(c, OP_ALL_GATHER, rc, rt);
  else count(c, OP_ALL_GATHER, sc, st);
  return PMPI_Allgather(s, sc, st, r, rc, rt, c);
}
int MPI_Iallgather(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, MPI_Comm c,
                   MPI_Request* q) {
  if (s == MPI_IN_PLACE) count(c, OP_ALL_GATHER, rc, rt);
  else count(c, OP_ALL_GATHER, sc, st);
  return PMPI_Iallgather(s, sc, st, r, rc, rt, c, q);
}
/* The count is the block sent to each rank (the rank's own included, as MPI
 * defines it); a ring-equivalent exchange moves (n-1) of them per rank. */
int MPI_Alltoall(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, MPI_Comm c) {
  if (s == MPI_IN_PLACE) count(c, OP_ALL_TO_ALL, rc, rt);
  else count(c, OP_ALL_TO_ALL, sc, st);
  return PMPI_Alltoall(s, sc, st, r, rc, rt, c);
}
int MPI_Ialltoall(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, MPI_Comm c,
                  MPI_Request* q) {
  if (s == MPI_IN_PLACE) count(c, OP_ALL_TO_ALL, rc, rt);
  else count(c, OP_ALL_TO_ALL, sc, st);
  return PMPI_Ialltoall(s, sc, st, r, rc, rt, c, q);
}
int MPI_Reduce_scatter_block(const void* s, void* r, int rc, MPI_Datatype t, MPI_Op o, MPI_Comm c) {
  count(c, OP_REDUCE_SCATTER, rc, t);
  return PMPI_Reduce_scatter_block(s, r, rc, t, o, c);
}
int MPI_Ireduce_scatter_block(const void* s, void* r, int rc, MPI_Datatype t, MPI_Op o, MPI_Comm c,
                              MPI_Request* q) {
  count(c, OP_REDUCE_SCATTER, rc, t);
  return PMPI_Ireduce_scatter_block(s, r, rc, t, o, c, q);
}
int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c) {
  count(c, OP_ALL_REDUCE, n, t);
  return PMPI_Allreduce(s, r, n, t, o, c);
}
int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c, MPI_Request* q) {
  count(c, OP_ALL_REDUCE, n, t);
  return PMPI_Iallreduce(s, r, n, t, o, c, q);
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  count(c, OP_BROADCAST, n, t);
  return PMPI_Bcast(b, n, t, root, c);
}
int MPI_Ibcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request* q) {
  count(c, OP_BROADCAST, n, t);
  return PMPI_Ibcast(b, n, t, root, c, q);
}

static void write_counts(FILE* f, const struct counts* t, int n) {
  fprintf(f, "{");
  for (int i = 0; i < n; ++i) {
    fprintf(f, "%s\n \"%s\": {\"size\": %d", i ? "," : "", t[i].name, t[i].size);
    for (int op = 0; op < NUM_OPS; ++op) {
      if (!t[i].calls[op]) continue;
      fprintf(f, ", \"%s\": {\"calls\": %lld, \"elements\": %lld, \"bytes\": %lld, \"blocks\": %lld}",
              op_names[op], t[i].calls[op], t[i].elements[op], t[i].bytes[op], t[i].blocks[op]);
    }
    fprintf(f, "}");
  }
  fprintf(f, "\n}");
}

int MPI_Finalize(void) {
  const char* dir = getenv("AMSP_MPI_COUNT_DIR");
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (dir && *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.json", dir, rank);
    FILE* f = fopen(path, "w");
    if (f) {
      write_counts(f, table, used);
      fprintf(f, "\n");
      fclose(f);
    }
    /* More marks than MAX_MARKS: no file, so that the test cannot read a partial list. */
    if (marked && !lost_marks) {
      snprintf(path, sizeof path, "%s/rank-%d-marks.json", dir, rank);
      f = fopen(path, "w");
      if (f) {
        fprintf(f, "[");
        for (int m = 0; m < marked; ++m) {
          fprintf(f, "%s\n", m ? "," : "");
          write_counts(f, marks[m].table, marks[m].used);
        }
        fprintf(f, "\n]\n");
        fclose(f);
      }
    }
  }
  return PMPI_Finalize();
}
