/* amk_abi.h — the device ABI of the amk megakernel.
 *
 * The first three structs are the frozen layouts of the IR's device format (append fields at the
 * end, never reorder); the rest is this backend's own. Every field carries its byte offset in a
 * comment of the form `@N` and every struct its size as `@size N`: a host test parses these
 * comments and checks them, the #defines and the enums against the Rust mirrors
 * (`src/abi.rs`), so drift on either side fails the build's tests.
 *
 * Compiled by NVRTC without toolkit headers.
 */
#ifndef AMK_ABI_H
#define AMK_ABI_H

#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#define AMK_ABI_VERSION_MAJOR 0
#define AMK_ABI_VERSION_MINOR 2
#define AMK_MAX_INPUTS 8
#define AMK_MAX_OUTPUTS 4
#define AMK_MAX_WAITS 8
#define AMK_MAX_RANK 4
/* Op-declared int/real params outside the frozen field set (e.g. ROPE's `pairing`), packed in
 * declaration order into `amk_params_t.ext` (reals as float bits). */
#define AMK_MAX_EXT_PARAMS 3
/* Counter c lives at counters[c * AMK_COUNTER_STRIDE]: one 128-byte line per counter. */
#define AMK_COUNTER_STRIDE 32

enum amk_dtype_t {
  AMK_F32 = 0,
  AMK_F16 = 1,
  AMK_BF16 = 2,
  AMK_F8E4M3 = 3,
  AMK_F8E5M2 = 4,
  AMK_I32 = 5,
  AMK_I8 = 6,
  AMK_I4 = 7,
  AMK_U8 = 8,
  AMK_BOOL = 9
};

enum amk_memspace_t {
  AMK_HBM = 0,
  AMK_GLOBAL_SCRATCH = 1,
  AMK_SMEM = 2,
  AMK_REGISTER = 3,
  AMK_HOST = 4 /* host memory mapped into the device (ours, appended) */
};

enum amk_opcode_t {
  AMK_OP_NOP = 0,
  AMK_OP_COPY = 1,
  AMK_OP_EMBED = 2,
  AMK_OP_RMSNORM = 3,
  AMK_OP_LAYERNORM = 4,
  AMK_OP_GEMV_TILE = 5,
  AMK_OP_GEMM_TILE = 6,
  AMK_OP_ATTENTION_TILE = 7,
  AMK_OP_ROPE = 8,
  AMK_OP_SILU_MUL = 9,
  AMK_OP_GELU = 10,
  AMK_OP_ADD = 11,
  AMK_OP_MUL = 12,
  AMK_OP_DEQUANT = 13,
  AMK_OP_SOFTMAX = 14,
  AMK_OP_ALLREDUCE_SHARD = 15,
  AMK_OP_KV_APPEND = 16,
  AMK_OP_SAMPLE_ARGMAX = 17,
  AMK_OP_ATTENTION_COMBINE = 18,
  AMK_OP_FUSED = 19
};

/* Status codes a task reports through amk_status_t (0 = no error). */
enum amk_error_t {
  AMK_OK = 0,
  AMK_ERR_UNKNOWN_OPCODE = 1,   /* detail: the opcode */
  AMK_ERR_BAD_BUFFER_ID = 2,    /* detail: the id */
  AMK_ERR_BAD_COUNTER_ID = 3,   /* detail: the id */
  AMK_ERR_INDEX = 4,            /* an index read from data is out of range; detail: the index */
  AMK_ERR_SHAPE = 5,            /* operand shapes do not fit the op; detail: op-specific */
  AMK_ERR_DTYPE = 6,            /* an operand dtype the op does not handle; detail: the dtype */
  AMK_ERR_PARAM = 7,            /* a param out of range; detail: its value */
  AMK_ERR_ABORTED = 8,          /* the host's abort flag was seen */
  AMK_ERR_NO_WAIT = 9           /* an op registered as waiting itself returned without waiting */
};

typedef uint32_t amk_counter_t;

typedef struct amk_params { /*@size 104*/
  int32_t K;          /*@0*/
  int32_t N;          /*@4*/
  int32_t M;          /*@8*/
  int32_t N_tile;     /*@12*/
  int32_t M_tile;     /*@16*/
  int32_t n_off;      /*@20*/
  int32_t m_off;      /*@24*/
  int32_t hidden;     /*@28*/
  int32_t vocab;      /*@32*/
  int32_t head_dim;   /*@36*/
  int32_t n_heads;    /*@40*/
  int32_t n_kv_heads; /*@44*/
  int32_t kv_start;   /*@48*/
  int32_t kv_len;     /*@52*/
  int32_t pos;        /*@56*/
  int32_t qdtype;     /*@60*/
  int32_t group;      /*@64*/
  int32_t flags;      /*@68*/
  int32_t dim;        /*@72*/
  float eps;          /*@76*/
  float scale;        /*@80*/
  float theta;        /*@84*/
  int32_t present;    /*@88*/ /* bit AMK_P_<field>: the task gave that param (ours, appended) */
  int32_t ext[3];     /*@92*/ /* op-declared params outside the fields above (ours, appended) */
} amk_params_t;

/* Bits of amk_params_t.present: the host's device-field table order (amk_core PARAM_FIELDS),
 * then one bit per ext slot. An absent param reads as 0: ops with a non-zero default test
 * the bit (amk_has). */
#define AMK_P_K 0
#define AMK_P_N 1
#define AMK_P_M 2
#define AMK_P_N_TILE 3
#define AMK_P_M_TILE 4
#define AMK_P_N_OFF 5
#define AMK_P_M_OFF 6
#define AMK_P_HIDDEN 7
#define AMK_P_VOCAB 8
#define AMK_P_HEAD_DIM 9
#define AMK_P_N_HEADS 10
#define AMK_P_N_KV_HEADS 11
#define AMK_P_KV_START 12
#define AMK_P_KV_LEN 13
#define AMK_P_POS 14
#define AMK_P_QDTYPE 15
#define AMK_P_FLAGS 16
#define AMK_P_DIM 17
#define AMK_P_GROUP 18
#define AMK_P_EPS 19
#define AMK_P_SCALE 20
#define AMK_P_THETA 21
#define AMK_P_EXT0 24
#define amk_has(params, bit) ((((params).present) >> (bit)) & 1)

/* amk_buffer_t.flags: no task of the program writes the buffer (its data is the host's, from
 * before the launch), so an op may read it before its task's wait. */
#define AMK_BUF_LAUNCH_CONST 1

typedef struct amk_buffer { /*@size 96*/
  void* ptr;          /*@0*/
  int64_t numel;      /*@8*/
  int32_t rank;       /*@16*/
  int32_t dtype;      /*@20*/
  int32_t space;      /*@24*/
  int32_t flags;      /*@28*/ /* AMK_BUF_* */
  int64_t shape[4];   /*@32*/
  int64_t stride[4];  /*@64*/
} amk_buffer_t;

typedef struct amk_instruction { /*@size 240*/
  int32_t op;                /*@0*/
  int32_t n_inputs;          /*@4*/
  int32_t n_outputs;         /*@8*/
  int32_t n_waits;           /*@12*/
  int32_t inputs[8];         /*@16*/
  int32_t outputs[4];        /*@48*/
  int32_t wait_counter[8];   /*@64*/
  int32_t wait_threshold[8]; /*@96*/
  int32_t out_counter;       /*@128*/
  int32_t sm;                /*@132*/
  amk_params_t params;       /*@136*/
} amk_instruction_t;

/* The first error of a launch: written once (the first failing task wins). */
typedef struct amk_status { /*@size 24*/
  int32_t code;       /*@0*/
  int32_t task;       /*@4*/
  int32_t op;         /*@8*/
  int32_t step;       /*@12*/ /* FUSED step index, -1 outside FUSED */
  int64_t detail;     /*@16*/
} amk_status_t;

/* The kernel's one parameter, passed by value. */
typedef struct amk_device_program { /*@size 160*/
  const amk_buffer_t* buffers;            /*@0*/
  const amk_instruction_t* instructions;  /*@8*/
  const amk_instruction_t* fused_steps;   /*@16*/ /* every FUSED task's expanded steps */
  const int32_t* fused_off;               /*@24*/ /* n_instructions + 1 offsets into fused_steps */
  const int32_t* queue_tasks;             /*@32*/ /* every queue's task ids, queue after queue */
  const int32_t* queue_off;               /*@40*/ /* n_queues + 1 offsets into queue_tasks */
  amk_counter_t* counters;                /*@48*/ /* n_counters * AMK_COUNTER_STRIDE words */
  volatile int32_t* abort_flag;           /*@56*/ /* host-mapped: the host's watchdog sets it */
  amk_status_t* status;                   /*@64*/ /* device memory, read back after the launch */
  int32_t n_buffers;                      /*@72*/
  int32_t n_counters;                     /*@76*/
  int32_t n_instructions;                 /*@80*/
  int32_t n_queues;                       /*@84*/
  int32_t smem_bytes;                     /*@88*/ /* dynamic shared memory per block */
  uint32_t epoch;                         /*@92*/ /* counters wait for threshold * epoch */
  uint64_t* trace;                        /*@96*/ /* null, or AMK_TRACE_WORDS per task */
  const amk_buffer_t* task_bufs;          /*@104*/ /* AMK_TASK_SLOTS per instruction: its operands' descriptors, input i in slot i, output j in slot AMK_MAX_INPUTS + j */
  int32_t* task_verified;                 /*@112*/ /* one word per instruction: 1 once amk_verify_tasks passed it (its ids and its op's pre-wait checks), 0 after any write of its record */
  /* The step loop (a program with one, run by the host's run_loop): passes 1..loop_passes in
   * one launch, pass k waiting for threshold * k (`epoch`). Before pass k + 1 every block
   * waits until counter loop_gate holds loop_gate_count * k, then stops if the halt word or
   * the stop word is non-zero. loop_passes 0 or 1: one pass, no gate. */
  uint32_t loop_passes;                   /*@120*/
  int32_t loop_gate;                      /*@124*/
  uint32_t loop_gate_count;               /*@128*/
  int32_t flags;                          /*@132*/ /* AMK_PROG_* bits (amk_tile.cuh, amk_scheduler.cuh) */
  volatile int32_t* loop_halt;            /*@136*/ /* element 0 of the program's halt buffer */
  volatile int32_t* loop_stop;            /*@144*/ /* device word: non-zero stops the loop at the next gate */
  volatile int32_t* loop_words;           /*@152*/ /* AMK_LOOP_WORDS host-mapped words: AMK_LOOP_* */
} amk_device_program_t;

/* amk_device_program::loop_words, host-mapped: the host writes AMK_LOOP_CANCEL while the
 * launch runs; a block that runs a producer of the gate reads it before the task and, if set,
 * sets `loop_stop` before it signals (one decision, which every block reads after the gate),
 * and writes the pass it finished into AMK_LOOP_DONE after it signals (the host's progress
 * and watchdog signal). */
#define AMK_LOOP_WORDS 16
#define AMK_LOOP_CANCEL 0
#define AMK_LOOP_DONE 1

/* Descriptor slots per task in amk_device_program::task_bufs (and in the scheduler's copy):
 * AMK_MAX_INPUTS inputs, then AMK_MAX_OUTPUTS outputs. */
#define AMK_TASK_SLOTS 12

/* Per-task trace (when `trace` is set): %globaltimer nanoseconds when the block reached the
 * task, when its waits were met, when it signalled; the block that ran it; when its op's
 * prologue ended (0 if the op records none: the row tiles record when their row is ready);
 * when its op returned (before the signal); when the scheduler dispatched it (its stage landed
 * and its ids checked); when the wait began (amk_task_wait entered, the op's checks done);
 * then AMK_TRACE_PROBES words an op may stamp at points of its own (amk_probe; 0: not
 * stamped), to see where a task's time goes inside the op. */
#define AMK_TRACE_PROBES 8
#define AMK_TRACE_WORDS (8 + AMK_TRACE_PROBES)

#endif /* AMK_ABI_H */
