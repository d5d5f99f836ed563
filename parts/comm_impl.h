/* parts/comm_impl.h: placeholder */
