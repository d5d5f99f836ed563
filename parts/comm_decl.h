/* parts/comm_decl.h: placeholder */
